// etcd: locco-rs against the `etcd3` npm package's lock (a lease per lock, granted, then the
// key put under it in a create_revision == 0 transaction; released by revoking the lease), same
// process, same server, same run. W1: sequential pairs on distinct keys. W2: concurrent
// workers on their own keys — 16, not the 64 of the other backends: every etcd write is a Raft
// proposal fsynced by the one member on this shared 2-core machine, and the etcd3 floor opens a
// lease per lock, so 64 workers measure the disk queue rather than either client.
import { Locker } from 'locco-rs';
import { EtcdAdapter } from 'locco-rs/etcd';
import { runBackendBench } from './pairs.mjs';
import { startEtcd } from '../__test__/support/servers.mjs';

const W1_PAIRS = Number(process.env.W1_PAIRS ?? 500);
const W2_WORKERS = Number(process.env.W2_WORKERS ?? 16);
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 5);
const TTL = 10_000;

let Etcd3;
try {
  ({ Etcd3 } = await import('etcd3'));
} catch {
  console.error('bench/etcd.mjs needs the etcd3 npm package as its floor: npm install --no-save etcd3');
  process.exit(1);
}

const server = await startEtcd();
const client = new Etcd3({ hosts: server.members[0].url });
const peer = {
  async pair(key) {
    const lock = client.lock(`floor/${key}`).ttl(TTL / 1000);
    await lock.acquire();
    await lock.release();
  },
  close: async () => client.close(),
};
const adapter = new EtcdAdapter({ endpoints: [server.endpoint], prefix: 'bench/' });
await runBackendBench({
  Locker,
  adapter,
  peer,
  server,
  ttl: TTL,
  floorName: 'etcd3',
  w1Pairs: W1_PAIRS,
  w2Workers: W2_WORKERS,
  w2Seconds: W2_SECONDS,
});
