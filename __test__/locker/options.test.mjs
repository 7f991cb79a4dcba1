// Unknown option names are refused with the field and the closest known name, on every
// constructor and call: a typo must never silently drop a namespace or a retry policy.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Locker, ValidationError, exponentialBackoff } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { MongoAdapter } from 'locco-rs/mongo';
import { MutexManager } from 'locco-rs/mutex';
import { PostgresAdapter } from 'locco-rs/postgres';
import { RedisAdapter } from 'locco-rs/redis';

/** Asserts `fn` throws (or rejects with) a ValidationError on `field` that suggests `guess`. */
async function refuses(fn, field, guess) {
  let error;
  try {
    await fn();
  } catch (e) {
    error = e;
  }
  assert.ok(error instanceof ValidationError, `expected a ValidationError on ${field}, got ${error}`);
  assert.equal(error.field, field);
  if (guess !== undefined) assert.match(error.message, new RegExp(`did you mean ${guess}\\?`));
}

describe('unknown options', () => {
  const adapter = new InMemoryAdapter();
  const locker = new Locker({ adapter, retry: { retries: 0 } });

  it('Locker options', async () => {
    await refuses(() => new Locker({ adapter, keyprefix: 'app:' }), 'keyprefix', 'keyPrefix');
    await refuses(() => new Locker({ adapter, onevent: () => {} }), 'onevent', 'onEvent');
    await refuses(() => new Locker({ adapter, retry: { retrys: 3 } }), 'retry.retrys', 'retries');
    await refuses(() => new Locker({ adapter, lockTtl: 5 }), 'lockTtl');
  });

  it('acquire, tryAcquire, withLock and acquireMany options (the short path too)', async () => {
    await refuses(() => locker.acquire('k', { ttl: 1000, retrys: 3 }), 'retrys', 'retry');
    await refuses(() => locker.acquire('k', { ttl: 1000, retry: { dealy: 5 } }), 'retry.dealy', 'delay');
    await refuses(() => locker.acquire('k', { ttl: 1000, autoExtend: { maxhold: 5 } }), 'autoExtend.maxhold', 'maxHold');
    await refuses(() => locker.tryAcquire('k', { ttl: 1000, autoextend: {} }), 'autoextend', 'autoExtend');
    await refuses(() => locker.withLock('k', { tll: 1000, ttl: 1000 }, async () => {}), 'tll', 'ttl');
    await refuses(() => locker.acquireMany(['a', 'b'], { ttl: 1000, singal: null }), 'singal', 'signal');
    // Nothing was taken by the refused calls.
    const lock = await locker.tryAcquire('k', { ttl: 1000 });
    assert.ok(lock);
    await lock.release();
  });

  it('adapter options', async () => {
    await refuses(() => new InMemoryAdapter({ nowFn: () => 0 }), 'nowFn', 'now');
    await refuses(() => new RedisAdapter({ url: 'redis://127.0.0.1:1', connectTimeOut: 5 }), 'connectTimeOut', 'connectTimeout');
    await refuses(
      () => new RedisAdapter({ url: 'redis://127.0.0.1:1', waitForReplicas: { replica: 1, timeout: 5 } }),
      'waitForReplicas.replica',
      'replicas',
    );
    await refuses(() => new PostgresAdapter({ url: 'postgres://u@127.0.0.1:1/db', tablename: 'x' }), 'tablename', 'tableName');
    await refuses(() => new MongoAdapter({ url: 'mongodb://127.0.0.1:1', dbname: 'x' }), 'dbname', 'dbName');
    await refuses(() => new MongoAdapter({ url: 'mongodb://127.0.0.1:1', writeConcern: { W: 1 } }), 'writeConcern.W', 'w');
  });

  it('exponentialBackoff and MutexManager options', async () => {
    await refuses(() => exponentialBackoff({ base: 10, max: 100, jiter: false }), 'jiter', 'jitter');
    await refuses(() => new MutexManager({ lockTtl: 1000 }), 'lockTtl', 'lockTTL');
    await refuses(() => new MutexManager({ adapter, redis: { url: 'redis://127.0.0.1:1' } }), 'redis');
    const manager = new MutexManager();
    await refuses(() => manager.runOperation('m', async () => {}, { timeout: 5 }), 'timeout', 'timeoutMs');
  });

  it('known options are accepted', async () => {
    const full = new Locker({ adapter, retry: { retries: 1, delay: 1, timeout: 1000 }, keyPrefix: 'p:', onEvent: () => {}, fencing: true });
    const lock = await full.acquire('k', { ttl: 1000, retry: { retries: 0 }, autoExtend: { maxHold: 5000, interval: 300 } });
    await lock.release();
  });
});

describe('wrong values', () => {
  const adapter = new InMemoryAdapter();
  const locker = new Locker({ adapter, retry: { retries: 0 } });

  it('are refused with the field named, on constructors and calls', async () => {
    await refuses(() => new Locker({ adapter, fencing: 'yes' }), 'fencing');
    await refuses(() => locker.acquireMany('a', { ttl: 1000 }), 'keys');
    await refuses(() => locker.acquireMany(['a', 7], { ttl: 1000 }), 'keys');
    await refuses(() => new InMemoryAdapter(null), 'options');
    await refuses(() => new InMemoryAdapter({ now: 5 }), 'now');
    await refuses(() => new RedisAdapter({ url: 'redis://127.0.0.1:1', waitForReplicas: 1 }), 'waitForReplicas');
    await refuses(() => new Locker({ adapter: { acquire() {}, release() {}, extend() {}, isHeld() {}, acquireFenced: 1 } }), 'adapter');
  });

  it("are refused on a built-in adapter's own methods, naming the field that is wrong", async () => {
    await refuses(() => adapter.acquire(null), 'input');
    await refuses(() => adapter.acquire({ key: 1, token: 't', ttl: 1000 }), 'key');
    await refuses(() => adapter.acquire({ key: 'k', token: 2, ttl: 1000 }), 'token');
    await refuses(() => adapter.acquire({ key: 'k', token: 't', ttl: '1000' }), 'ttl');
    // Nothing was taken by the refused calls.
    assert.equal(await adapter.acquire({ key: 'k', token: 't', ttl: 1000 }), true);
    assert.equal(await adapter.release({ key: 'k', token: 't' }), true);
  });

  it("a JavaScript adapter's malformed inspect answer is refused, not passed on", async () => {
    const odd = {
      acquire: async () => true,
      release: async () => true,
      extend: async () => true,
      isHeld: async () => true,
      inspect: async () => ({ held: 'yes' }),
    };
    const withOdd = new Locker({ adapter: odd });
    await refuses(() => withOdd.inspect('k'), 'adapter');
  });
});
