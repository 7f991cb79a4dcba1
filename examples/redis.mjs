// Redis or Valkey backend. The URL comes from REDIS_URL (default redis://127.0.0.1:6379).
// Run: REDIS_URL=redis://127.0.0.1:6379 node examples/redis.mjs
// Node.js 24 or newer: it uses `await using` (see the README for Node 22).
import { Locker } from 'locco-rs';
import { RedisAdapter } from 'locco-rs/redis';

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
console.log(`Redis at ${url.replace(/\/\/[^@/]*@/, '//***@')} (set REDIS_URL to change it)`);

await using adapter = new RedisAdapter({ url, connectTimeout: 2_000 });
const locker = new Locker({ adapter, fencing: true, keyPrefix: 'locco-example:' });

const total = await locker.withLock('invoice:42', { ttl: 10_000 }, async (lock) => {
  console.log(`holding ${lock.key} with fence ${lock.fence}`);
  return 42;
});
console.log(`withLock returned ${total}; the key is free again`);

const lock = await locker.tryAcquire('invoice:42', { ttl: 10_000 });
console.log(`tryAcquire after release: ${lock ? 'got it' : 'held elsewhere'}`);
await lock?.release();
