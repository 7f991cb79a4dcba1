// A waiter in a process of its own, driven by its parent over IPC, for the fair-queue tests.
// argv: adapter ('redis' | 'redis-cluster' | 'mongo'), url(s) comma-separated, counter URL (a
// Redis server for the fenced counter), and for 'mongo' the database name.
// Parent → child: { op: 'acquire', key, ttl, timeout, delay? }, { op: 'release' }.
// Child → parent: { event: 'ready' }, { event: 'queued' } (first attempt found the key taken),
// { event: 'granted', fence, waitedMs }, { event: 'failed', message }, { event: 'released' }.
// While it holds, the child runs the fenced counter update: read the counter, check the fence
// grows, write count + 1 (a lost update or a fence that goes back is reported as 'violation').
import Redis from 'ioredis';
import { Locker } from 'locco-rs';
import { RedisAdapter } from 'locco-rs/redis';

const [kind, urls, counterUrl, dbName] = process.argv.slice(2);
const adapter =
  kind === 'mongo'
    ? new (await import('locco-rs/mongo')).MongoAdapter({ url: urls, dbName })
    : kind === 'redis-cluster'
      ? new RedisAdapter({ urls: urls.split(','), cluster: true })
      : new RedisAdapter({ url: urls });
let queued;
const locker = new Locker({
  adapter,
  fencing: true,
  onEvent: (e) => {
    if (e.type === 'contended' && queued) {
      queued();
      queued = undefined;
    }
  },
});
const counter = new Redis(counterUrl, { lazyConnect: true });
await counter.connect();
let lock;

async function fencedIncrement(key, fence) {
  const [last, count] = ((await counter.get(`count:${key}`)) ?? '0:0').split(':').map(Number);
  if (!(fence > last)) process.send({ event: 'violation', message: `fence ${fence} after ${last}` });
  await new Promise((r) => setTimeout(r, 2)); // a window for a second holder to interleave
  await counter.set(`count:${key}`, `${fence}:${count + 1}`);
}

process.on('message', async (m) => {
  if (m.op === 'acquire') {
    queued = () => process.send({ event: 'queued' });
    const started = performance.now();
    try {
      // `delay` (optional, the mongo tests send it): a long one shows that hand-offs are pushed.
      const delay = m.delay === undefined ? {} : { delay: m.delay };
      lock = await locker.acquire(m.key, { ttl: m.ttl, retry: { retries: Infinity, timeout: m.timeout ?? 30_000, ...delay } });
      await fencedIncrement(m.key, lock.fence);
      process.send({ event: 'granted', fence: lock.fence, waitedMs: performance.now() - started });
    } catch (e) {
      process.send({ event: 'failed', message: String(e?.message ?? e) });
    }
  } else if (m.op === 'release') {
    await lock?.release();
    lock = undefined;
    process.send({ event: 'released' });
  } else if (m.op === 'exit') {
    await adapter.close?.();
    counter.disconnect();
    process.exit(0);
  }
});
process.send({ event: 'ready' });
