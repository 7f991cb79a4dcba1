// Release smoke test: loads the native binding through the package's own facade and takes and
// releases locks, in memory and (when LOCCO_SMOKE_REDIS_URL is set) on a Redis server. Run by
// scripts/release-check.sh under each built binary (the arm64 one under qemu) and by the release
// workflow on each platform. Exits non-zero on the first failure.
import assert from 'node:assert/strict';
import { Locker, LockHeldError } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

const started = Date.now();
const say = (msg) => console.log(`smoke: ${msg} (${Date.now() - started} ms)`);
say(`node ${process.version} ${process.platform}-${process.arch}`);

async function exercise(name, adapter) {
  const locker = new Locker({ adapter, retry: { retries: 0 } });
  const key = `smoke:${process.pid}:${name}`;
  const lock = await locker.acquire(key, { ttl: 5000 });
  assert.equal(lock.state, 'held');
  await assert.rejects(locker.acquire(key, { ttl: 5000 }), LockHeldError, 'a held key is refused');
  assert.equal(await lock.release(), true);
  assert.equal(lock.state, 'released');
  const again = await locker.acquire(key, { ttl: 5000 });
  assert.equal(await again.release(), true);
  const value = await locker.withLock(key, { ttl: 5000 }, async () => 42);
  assert.equal(value, 42);
  say(`${name}: acquire, refuse, release, re-acquire and withLock passed`);
}

await exercise('memory', new InMemoryAdapter());

const url = process.env.LOCCO_SMOKE_REDIS_URL;
if (url) {
  const { RedisAdapter } = await import('locco-rs/redis');
  const adapter = new RedisAdapter({ url });
  try {
    await exercise('redis', adapter);
  } finally {
    await adapter.close();
  }
} else {
  say('redis: skipped (LOCCO_SMOKE_REDIS_URL is not set)');
}
say('all passed');
