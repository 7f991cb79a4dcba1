// Redis and Valkey test servers: one server, a Redis Cluster, and the valkey-server binary.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort, hasCommand, sleep, spawnLogged, withRetries } from './common.mjs';

/**
 * LOCCO_TEST_REDIS_URL (redis://host:port): a Redis server already running, used instead of
 * spawning one. It is for a Node that cannot start Linux programs, such as Windows' node.exe under
 * Wine (scripts/release-check.sh). Such a server cannot be restarted, paused or given flags, so the
 * tests that need that are skipped (redisIsExternal); it is emptied when a test takes and leaves it.
 */
const EXTERNAL_REDIS = process.env.LOCCO_TEST_REDIS_URL || '';
export const redisIsExternal = () => EXTERNAL_REDIS !== '';

// One command over RESP, answered as redis-cli prints it (a child Node, so that cli() stays
// synchronous without needing redis-cli).
const RESP_CLI = `
const [host, port, ...cmd] = process.argv.slice(1);
const sock = require('net').connect(Number(port), host);
sock.write('*' + cmd.length + '\\r\\n' + cmd.map((c) => '$' + Buffer.byteLength(c) + '\\r\\n' + c + '\\r\\n').join(''));
let buf = Buffer.alloc(0);
const parse = (i) => {
  const eol = buf.indexOf('\\r\\n', i);
  if (eol < 0) return null;
  const type = String.fromCharCode(buf[i]);
  const line = buf.toString('utf8', i + 1, eol);
  if (type === '+' || type === '-' || type === ':') return { v: line, next: eol + 2 };
  const n = Number(line);
  if (type === '$') {
    if (n < 0) return { v: '', next: eol + 2 };
    if (buf.length < eol + 2 + n + 2) return null;
    return { v: buf.toString('utf8', eol + 2, eol + 2 + n), next: eol + 2 + n + 2 };
  }
  const items = [];
  let at = eol + 2;
  for (let k = 0; k < n; k++) {
    const r = parse(at);
    if (!r) return null;
    items.push(r.v);
    at = r.next;
  }
  return { v: items.join('\\n'), next: at };
};
sock.on('data', (d) => {
  buf = Buffer.concat([buf, d]);
  const r = parse(0);
  if (r) { process.stdout.write(r.v + '\\n'); sock.destroy(); }
});
`;

function externalRedis(url) {
  const { hostname, port } = new URL(url);
  const cantControl = (what) => () => {
    throw new Error(`an external Redis (LOCCO_TEST_REDIS_URL) cannot be ${what}`);
  };
  const server = {
    port: Number(port),
    url,
    get pid() {
      return undefined;
    },
    stop: cantControl('stopped'),
    restart: cantControl('restarted'),
    pause: cantControl('paused'),
    resume: cantControl('resumed'),
    throttle: cantControl('throttled'),
    cli(...cmd) {
      return execFileSync(process.execPath, ['-e', RESP_CLI, hostname, port, ...cmd], { encoding: 'utf8' }).trim();
    },
    calls(command) {
      const stats = server.cli('INFO', 'commandstats');
      return Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
    },
    async dispose() {
      server.cli('FLUSHALL');
    },
  };
  server.cli('FLUSHALL');
  return server;
}

/**
 * Starts a redis-server (or valkey-server) with `args` appended. Returns { port, url, stop,
 * restart, pause, resume, cli }. `port` is kept across restarts. `cluster`: cluster mode, with
 * the bus on a free port too. A free port can be taken by another process before the server
 * binds it, so a server on ports of our choosing that fails to start is tried on new ones.
 */
export async function startRedis({ binary = 'redis-server', args = [], port, tlsPort, cluster = false } = {}) {
  if (EXTERNAL_REDIS) {
    if (args.length || port !== undefined || tlsPort !== undefined || cluster || binary !== 'redis-server') {
      throw new Error('LOCCO_TEST_REDIS_URL names one plain server: a test that needs flags, ports, TLS or a cluster cannot use it');
    }
    return externalRedis(EXTERNAL_REDIS);
  }
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
