// Test servers on free loopback ports, in temporary directories, stopped afterwards.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A loopback TCP proxy to `port`. `delay` holds each new connection that many ms before it
 * connects through (a slow network for a client's first connection); `cut()` drops every
 * connection and stops listening (a connect is refused) until `restore()`; `stall(ms)` holds
 * every byte in both directions for `ms` (a network that stops, then delivers), resolving once
 * they have been passed on; `urlFor(url)` is `url` with its port pointed at the proxy.
 * Returns { port, urlFor, cut, restore, stall, close }.
 */
export async function testProxy(port, { delay = 0 } = {}) {
  const sockets = new Set();
  let held; // the bytes kept while stalled: [socket, chunk][]
  const forward = (from, to) =>
    from.on('data', (chunk) => {
      if (held !== undefined) held.push([to, chunk]);
      else to.write(chunk);
    });
  const server = createServer((client) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    client.on('error', () => {});
    client.pause();
    setTimeout(() => {
      if (client.destroyed) return;
      const upstream = connect(port, '127.0.0.1');
      sockets.add(upstream);
      upstream.on('error', () => client.destroy());
      upstream.on('close', () => {
        sockets.delete(upstream);
        client.destroy();
      });
      client.on('close', () => upstream.destroy());
      forward(client, upstream);
      forward(upstream, client);
      client.resume();
    }, delay);
  });
  const listen = (at) => new Promise((resolve) => server.listen(at, '127.0.0.1', resolve));
  const stop = () => {
    const closed = new Promise((resolve) => server.close(resolve));
    for (const s of sockets) s.destroy();
    return closed;
  };
  const stall = async (ms) => {
    held = [];
    await sleep(ms);
    const kept = held;
    held = undefined;
    for (const [to, chunk] of kept) if (!to.destroyed) to.write(chunk);
  };
  await listen(0);
  const own = server.address().port;
  const urlFor = (url) => {
    const proxied = new URL(url);
    proxied.port = String(own);
    return proxied.href;
  };
  return { port: own, urlFor, cut: stop, restore: () => listen(own), stall, close: () => (server.listening ? stop() : undefined) };
}

/**
 * Whether process `pid` has a socket listening on TCP `port` (Linux: the listening sockets in
 * /proc/net/tcp*, matched by inode to the process's descriptors). A port that answers is not
 * proof that our server holds it: another process may have taken the free port first.
 */
function listensOn(pid, port) {
  const hexPort = `:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  const inodes = new Set();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      // sl local_address rem_address st ... inode: st 0A is LISTEN.
      const f = line.trim().split(/\s+/);
      if (f.length > 9 && f[1].endsWith(hexPort) && f[3] === '0A') inodes.add(f[9]);
    }
  }
  if (inodes.size === 0) return false;
  let fds = [];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return false;
  }
  return fds.some((fd) => {
    try {
      return inodes.has(/^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1]);
    } catch {
      return false; // closed meanwhile
    }
  });
}

/**
 * Waits until `spawned`'s own process listens on `port`; fails at once, with its output, when it
 * exits first (a port another process holds, a bad flag), and after `ms` with its output too.
 */
async function listening(spawned, port, ms) {
  const { child, output } = spawned;
  const end = Date.now() + ms;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`${child.spawnfile} exited (${child.exitCode ?? child.signalCode}) before it listened on port ${port}: ${output()}`);
    }
    if (listensOn(child.pid, port)) return;
    if (Date.now() > end) {
      child.kill('SIGKILL');
      throw new Error(`${child.spawnfile} did not listen on port ${port} in ${ms} ms: ${output()}`);
    }
    await sleep(50);
  }
}

/** `start(attempt)` until it succeeds, at most three times: a free port can be taken first. */
async function withRetries(start) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start(attempt);
    } catch (err) {
      if (attempt === 3) throw err;
    }
  }
}

export function hasCommand(cmd) {
  try {
    execFileSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/**
 * Servers still running. A test file whose set-up throws after it started one never reaches
 * its dispose; when the process ends they are killed, instead of living on as orphans. (An
 * exit handler runs on an uncaught error too, though not when the process itself is killed.)
 */
const running = new Set();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

/**
 * Spawns `binary`, keeping the last few KB of its output. `ready(pattern, ms)` waits for a line
 * that matches, and fails at once, with that output, when the process exits first. (A port that
 * answers is not proof: another process may have taken the free port first.)
 */
function spawnLogged(binary, args) {
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  running.add(child);
  child.once('exit', () => running.delete(child));
  let tail = '';
  let onData = () => {};
  const keep = (chunk) => {
    tail = (tail + chunk).slice(-4000);
    onData();
  };
  child.stdout.setEncoding('utf8').on('data', keep);
  child.stderr.setEncoding('utf8').on('data', keep);
  const output = () => tail.trim() || '(no output)';
  const ready = (pattern, ms) =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => done(new Error(`${binary} printed no ${pattern} in ${ms} ms: ${output()}`)), ms);
      const exited = (code, signal) => done(new Error(`${binary} exited (${code ?? signal}) before it was ready: ${output()}`));
      const done = (err) => {
        clearTimeout(timer);
        child.off('exit', exited);
        onData = () => {};
        if (err) reject(err);
        else resolve();
      };
      onData = () => {
        if (pattern.test(tail)) done();
      };
      child.once('exit', exited);
      onData();
    });
  return { child, output, ready };
}

/**
 * Starts a redis-server (or valkey-server) with `args` appended. Returns { port, url, stop,
 * restart, pause, resume, cli }. `port` is kept across restarts. `cluster`: cluster mode, with
 * the bus on a free port too. A free port can be taken by another process before the server
 * binds it, so a server on ports of our choosing that fails to start is tried on new ones.
 */
export async function startRedis({ binary = 'redis-server', args = [], port, tlsPort, cluster = false } = {}) {
  const ownPorts = port === undefined && tlsPort === undefined;
  let busPort;
  const dir = mkdtempSync(join(tmpdir(), 'locco-redis-'));
  let child;
  const launch = async () => {
    const listenPort = tlsPort ? 0 : port;
    const base = ['--port', String(listenPort), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no'];
    if (tlsPort) base.push('--tls-port', String(tlsPort));
    if (cluster) base.push('--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-port', String(busPort));
    const spawned = spawnLogged(binary, [...base, ...args]);
    child = spawned.child;
    try {
      await spawned.ready(/Ready to accept connections/, 10_000);
    } catch (err) {
      child.kill('SIGKILL');
      throw err;
    }
  };
  const tryPorts = async (attempt) => {
    if (port === undefined || attempt > 1) port = await freePort();
    if (cluster && (busPort === undefined || attempt > 1)) busPort = await freePort();
    rmSync(join(dir, 'nodes.conf'), { force: true }); // a failed try's cluster state
    await launch();
  };
  try {
    await (ownPorts ? withRetries(tryPorts) : tryPorts(1));
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  const server = {
    port: tlsPort ?? port,
    url: `redis://127.0.0.1:${port}`,
    /** The server's process id (for CPU readings in benchmarks). */
    get pid() {
      return child.pid;
    },
    async stop() {
      if (child && child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGCONT');
        child.kill('SIGKILL');
        await exited;
      }
    },
    async restart() {
      await server.stop();
      await launch();
    },
    pause() {
      child.kill('SIGSTOP');
    },
    resume() {
      child.kill('SIGCONT');
    },
    /**
     * Makes the server slow, as one shared with busier clients: a process of its own (this
     * one's event loop may be busy) lets it run `runMs` out of every `runMs + pauseMs`.
     * Answers a function that stops the throttle and leaves the server running.
     */
    throttle(runMs, pauseMs) {
      const s = (ms) => (ms / 1000).toFixed(3);
      const pid = child.pid;
      const loop = `while :; do kill -STOP ${pid}; sleep ${s(pauseMs)}; kill -CONT ${pid}; sleep ${s(runMs)}; done`;
      const throttler = spawn('sh', ['-c', loop], { stdio: 'ignore' });
      return async () => {
        const exited = new Promise((r) => throttler.once('exit', r));
        throttler.kill('SIGKILL');
        await exited;
        child.kill('SIGCONT');
      };
    },
    cli(...cmd) {
      return execFileSync('redis-cli', ['-p', String(port), ...cmd], { encoding: 'utf8' }).trim();
    },
    /** How many times the server has run `command` (lower case, as INFO commandstats names it). */
    calls(command) {
      const stats = server.cli('INFO', 'commandstats');
      return Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
    },
    async dispose() {
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  return server;
}

/**
 * A Redis Cluster of `size` primaries with `replicas` replicas each, each node on free ports
 * with `args` added, every node reporting cluster_state:ok and every replica in sync.
 * Answers { nodes, urls, dispose }.
 */
export async function startRedisCluster({ size = 3, replicas = 0, args = [] } = {}) {
  const nodes = [];
  const dispose = async () => {
    await Promise.all(nodes.map((n) => n.dispose()));
  };
  try {
    for (let i = 0; i < size * (1 + replicas); i++) nodes.push(await startRedis({ cluster: true, args }));
    execFileSync('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', String(replicas), '--cluster-yes'], {
      stdio: 'pipe',
    });
    const end = Date.now() + 15_000;
    const synced = (n) => !n.cli('INFO', 'replication').includes('role:slave') || n.cli('INFO', 'replication').includes('master_link_status:up');
    while (!nodes.every((n) => n.cli('CLUSTER', 'INFO').includes('cluster_state:ok') && synced(n))) {
      if (Date.now() > end) throw new Error('the Redis Cluster did not reach cluster_state:ok with its replicas in sync in 15 s');
      await sleep(50);
    }
  } catch (err) {
    await dispose();
    throw err;
  }
  return { nodes, urls: nodes.map((n) => n.url), dispose };
}

/**
 * The valkey-server the tests run: LOCCO_VALKEY_SERVER, PATH, or the copy scripts/test-all.sh
 * installed in the cache.
 */
export function valkeyBinary() {
  if (process.env.LOCCO_VALKEY_SERVER) return process.env.LOCCO_VALKEY_SERVER;
  if (hasCommand('valkey-server')) return 'valkey-server';
  const cache = join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'locco-rs', 'valkey');
  const found = execFileSync('sh', ['-c', `find "${cache}" -name valkey-server -type f 2>/dev/null | head -n1`], {
    encoding: 'utf8',
  }).trim();
  if (found) return found;
  throw new Error('valkey-server not found: run scripts/test-all.sh, which installs it');
}

/** The PostgreSQL binaries: the newest /usr/lib/postgresql/<n>/bin. */
export function pgBin() {
  const dirs = execFileSync('sh', ['-c', 'ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1'], {
    encoding: 'utf8',
  }).trim();
  if (!dirs) throw new Error('PostgreSQL is not installed: run scripts/test-all.sh, which installs it');
  return dirs;
}

/**
 * Starts PostgreSQL: initdb as the postgres user into a temp dir, a free port, password auth
 * over TCP (superuser postgres, password `postgres-pw`). `ssl`: { cert, key } file contents.
 */
export async function startPostgres({ ssl, maxConnections } = {}) {
  const bin = pgBin();
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'locco-pg-'));
  const data = join(dir, 'data');
  const asPg = (cmd) => execFileSync('su', ['postgres', '-s', '/bin/sh', '-c', cmd], { stdio: 'pipe' });
  writeFileSync(join(dir, 'pw'), 'postgres-pw\n');
  execFileSync('chown', ['-R', 'postgres:postgres', dir]);
  asPg(`${bin}/initdb -D ${data} -U postgres --pwfile=${dir}/pw --auth-host=scram-sha-256 --auth-local=trust -E UTF8 >/dev/null`);
  let options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`;
  if (maxConnections) options += ` -c max_connections=${maxConnections}`;
  if (ssl) {
    writeFileSync(join(data, 'server.crt'), ssl.cert);
    writeFileSync(join(data, 'server.key'), ssl.key, { mode: 0o600 });
    execFileSync('chown', ['postgres:postgres', join(data, 'server.crt'), join(data, 'server.key')]);
    options += ' -c ssl=on';
  }
  const start = () => asPg(`${bin}/pg_ctl -D ${data} -o "${options}" -l ${dir}/log -w start >/dev/null`);
  start();
  const admin = `postgres://postgres:postgres-pw@127.0.0.1:${port}/postgres`;
  return {
    port,
    url: admin,
    urlFor: (user, password) => `postgres://${user}:${password}@127.0.0.1:${port}/postgres`,
    /** Runs SQL as the superuser through psql (the simple query protocol). */
    psql(sql) {
      return execFileSync('psql', [admin, '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', sql], { encoding: 'utf8' }).trim();
    },
    /** A psql process of its own, fed `sql` on stdin; kill() ends it. */
    session(sql) {
      const child = spawn('psql', [admin, '-v', 'ON_ERROR_STOP=1', '-q'], { stdio: ['pipe', 'ignore', 'ignore'] });
      child.stdin.write(sql);
      return child;
    },
    async restart() {
      asPg(`${bin}/pg_ctl -D ${data} -m immediate stop >/dev/null`);
      start();
    },
    async dispose() {
      try {
        asPg(`${bin}/pg_ctl -D ${data} -m immediate stop >/dev/null`);
      } catch {
        // already stopped
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * A throwaway CA and a server certificate it signs for localhost and 127.0.0.1, made by
 * openssl in a temp dir. Answers PEM text: { ca, cert, key } and the files' paths. The servers
 * read the files while the test process lives, so the dir goes when the process exits.
 */
export function makeTestCertificates() {
  const dir = mkdtempSync(join(tmpdir(), 'locco-tls-'));
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  const at = (f) => join(dir, f);
  const ssl = (...args) => execFileSync('openssl', args, { stdio: 'ignore' });
  ssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=locco-test-ca', '-keyout', at('ca.key'), '-out', at('ca.pem'));
  ssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=localhost', '-keyout', at('key.pem'), '-out', at('req.csr'));
  writeFileSync(at('ext.cnf'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  ssl('x509', '-req', '-in', at('req.csr'), '-CA', at('ca.pem'), '-CAkey', at('ca.key'), '-CAcreateserial', '-days', '1', '-out', at('cert.pem'), '-extfile', at('ext.cnf'));
  return {
    ca: readFileSync(at('ca.pem'), 'utf8'),
    cert: readFileSync(at('cert.pem'), 'utf8'),
    key: readFileSync(at('key.pem'), 'utf8'),
    certFile: at('cert.pem'),
    keyFile: at('key.pem'),
  };
}

/** The MongoDB-wire-compatible server the tests start (secantusd-rs, cached by the test script). */
export function secantusBinary() {
  if (process.env.LOCCO_SECANTUS) return process.env.LOCCO_SECANTUS;
  if (hasCommand('secantusd-rs')) return 'secantusd-rs';
  const bin = join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'locco-rs', 'secantus', 'bin', 'secantusd-rs');
  try {
    execFileSync(bin, ['--version'], { stdio: 'ignore' });
    return bin;
  } catch {
    throw new Error('secantusd-rs not found: run scripts/test-all.sh, which builds and caches it');
  }
}

/**
 * A MongoDB for the tests: LOCCO_TEST_MONGO_URL when set (a real mongod of yours), else
 * secantusd-rs on a free port (or `port`) with a temp storage path. Answers { url, name, dispose }.
 */
export async function startMongo({ port: askedPort } = {}) {
  if (process.env.LOCCO_TEST_MONGO_URL) {
    return { url: process.env.LOCCO_TEST_MONGO_URL, name: 'LOCCO_TEST_MONGO_URL', async dispose() {} };
  }
  const binary = secantusBinary();
  const start = async () => {
    const port = askedPort ?? (await freePort());
    const dir = mkdtempSync(join(tmpdir(), 'locco-mongo-'));
    let child;
    const launch = async () => {
      const spawned = spawnLogged(binary, ['--port', String(port), '--storage-path', join(dir, 'data'), '--cache-size', '128M', '--log-file-max', '16MB', '--log-level', 'WARNING']);
      child = spawned.child;
      await listening(spawned, port, 30_000);
    };
    const kill = async (signal) => {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill(signal);
        await exited;
      }
    };
    const stop = async () => {
      await kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    };
    try {
      await launch();
    } catch (err) {
      await stop();
      throw err;
    }
    return {
      url: `mongodb://127.0.0.1:${port}/?directConnection=true`,
      name: 'secantusd-rs',
      get pid() {
        return child.pid;
      },
      /** Shuts the server down (SIGTERM) and starts it again on the same port and data. */
      async restart() {
        await kill('SIGTERM');
        await launch();
      },
      dispose: stop,
    };
  };
  return askedPort === undefined ? withRetries(start) : start();
}

/**
 * Starts an etcd cluster of `size` members on free loopback ports, in a temporary directory.
 * Returns { members: [{ name, endpoint, url, pause, resume, stop, start, running }], endpoints,
 * leader(), call(member, path, body), dispose }. Elections are fast (50 ms beats, 500 ms timeout).
 */
export async function startEtcdCluster({ size = 3, binary = 'etcd', tls, port } = {}) {
  const start = () => startEtcdOnce({ size, binary, tls, port });
  return port === undefined ? withRetries(start) : start();
}

/** startEtcdCluster's one try; `port`: the first member's client port instead of a free one. */
async function startEtcdOnce({ size, binary, tls, port }) {
  const dir = mkdtempSync(join(tmpdir(), 'locco-etcd-'));
  const ports = [];
  for (let i = 0; i < size; i++) {
    const client = i === 0 && port !== undefined ? port : await freePort();
    ports.push({ client, peer: await freePort(), tls: tls ? await freePort() : undefined });
  }
  const cluster = ports.map((p, i) => `m${i}=http://127.0.0.1:${p.peer}`).join(',');
  const token = `locco-${ports[0].peer}`;
  const members = ports.map((p, i) => {
    const name = `m${i}`;
    let child;
    const member = {
      name,
      endpoint: `127.0.0.1:${p.client}`,
      url: `http://127.0.0.1:${p.client}`,
      // With `tls: { certFile, keyFile }`, a second client listener speaks TLS.
      tlsEndpoint: tls ? `https://127.0.0.1:${p.tls}` : undefined,
      async start() {
        const clientUrls = tls ? `${member.url},${member.tlsEndpoint}` : member.url;
        const spawned = spawnLogged(
          binary,
          [
            '--name', name,
            '--data-dir', join(dir, name),
            '--listen-client-urls', clientUrls,
            '--advertise-client-urls', clientUrls,
            ...(tls ? ['--cert-file', tls.certFile, '--key-file', tls.keyFile] : []),
            '--listen-peer-urls', `http://127.0.0.1:${p.peer}`,
            '--initial-advertise-peer-urls', `http://127.0.0.1:${p.peer}`,
            '--initial-cluster', cluster,
            '--initial-cluster-state', 'new',
            '--initial-cluster-token', token,
            '--heartbeat-interval', '50',
            '--election-timeout', '500',
            '--log-level', 'error',
          ],
        );
        child = spawned.child;
        await listening(spawned, p.client, 10_000);
      },
      running: () => Boolean(child && child.exitCode === null && child.signalCode === null),
      pause: () => child.kill('SIGSTOP'),
      resume: () => child.kill('SIGCONT'),
      async stop() {
        if (member.running()) {
          const exited = new Promise((r) => child.once('exit', r));
          child.kill('SIGCONT');
          child.kill('SIGKILL');
          await exited;
        }
      },
    };
    return member;
  });
  const call = async (member, path, body = {}, headers = {}) => {
    const res = await fetch(`${member.url}/v3/${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(3000),
    });
    const json = await res.json();
    if (!res.ok) throw new Error(`etcd ${path}: ${JSON.stringify(json)}`);
    return json;
  };
  const server = {
    members,
    endpoints: members.map((m) => m.endpoint),
    call,
    /** The member that leads now (waits for an election). */
    async leader(ms = 10_000) {
      const end = Date.now() + ms;
      for (;;) {
        for (const m of members.filter((x) => x.running())) {
          try {
            const s = await call(m, 'maintenance/status');
            if (s.leader && s.leader !== '0' && s.leader === s.header.member_id) return m;
          } catch {
            // not ready, or paused
          }
        }
        if (Date.now() > end) throw new Error('the etcd cluster has no leader');
        await sleep(50);
      }
    },
    async dispose() {
      await Promise.all(members.map((m) => m.stop()));
      rmSync(dir, { recursive: true, force: true });
    },
  };
  try {
    await Promise.all(members.map((m) => m.start()));
    await server.leader(30_000);
  } catch (e) {
    await server.dispose();
    throw e;
  }
  return server;
}

/** A one-member etcd: startEtcdCluster({ size: 1 }) plus `endpoint`, `pause`, `resume`. */
export async function startEtcd(options = {}) {
  const server = await startEtcdCluster({ ...options, size: 1 });
  const [m] = server.members;
  return { ...server, endpoint: m.endpoint, url: m.url, tlsEndpoint: m.tlsEndpoint, pause: m.pause, resume: m.resume };
}
