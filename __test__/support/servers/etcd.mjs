// etcd test servers: a cluster of members, or one member.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort, listening, sleep, spawnLogged, withRetries } from './common.mjs';

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
