import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { describe, it } from 'node:test';
import * as esm from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

const cjs = createRequire(import.meta.url)('locco-rs');
const { Locker, ValidationError, LockHeldError, LoccoError } = esm;

describe('errors', () => {
  it('are the same classes from ESM and CommonJS, with stable codes', async () => {
    for (const name of ['LoccoError', 'LockHeldError', 'LockLostError', 'LockStateError', 'ValidationError', 'BackendError']) {
      assert.equal(esm[name], cjs[name], name);
    }
    const locker = new cjs.Locker({ adapter: new InMemoryAdapter(), retry: { retries: 0 } });
    await locker.acquire('k', { ttl: 1000 });
    const err = await locker.acquire('k', { ttl: 1000 }).catch((e) => e);
    assert.ok(err instanceof LockHeldError && err instanceof cjs.LockHeldError && err instanceof Error);
    assert.equal(err.name, 'LockHeldError');
    assert.equal(err.code, 'LOCK_HELD');
    const codes = {
      LockHeldError: 'LOCK_HELD',
      LockLostError: 'LOCK_LOST',
      LockStateError: 'LOCK_STATE',
      ValidationError: 'LOCK_VALIDATION',
      BackendError: 'LOCK_BACKEND',
    };
    for (const [name, code] of Object.entries(codes)) {
      const e = new esm[name]('m', {});
      assert.equal(e.code, code);
      assert.ok(e instanceof LoccoError);
    }
  });
});

describe('validation names the field, before any I/O', () => {
  const adapter = new InMemoryAdapter();
  const locker = new Locker({ adapter });
  const bad = async (field, fn) => {
    const err = await Promise.resolve().then(fn).catch((e) => e);
    assert.ok(err instanceof ValidationError, `${field}: ${err}`);
    assert.equal(err.field, field);
    assert.equal(err.code, 'LOCK_VALIDATION');
  };

  it('keys', async () => {
    await bad('key', () => locker.acquire('', { ttl: 1000 }));
    await bad('key', () => locker.acquire(42, { ttl: 1000 }));
    await bad('key', () => locker.acquire('x'.repeat(4097), { ttl: 1000 }));
    await bad('key', () => locker.tryAcquire('', { ttl: 1000 }));
  });

  it('ttl', async () => {
    await bad('ttl', () => locker.acquire('k', {}));
    await bad('ttl', () => locker.acquire('k', { ttl: '1000' }));
    for (const ttl of [0, -1, 1.5, NaN, Infinity, 2 ** 31]) await bad('ttl', () => locker.acquire('k', { ttl }));
    const lock = await locker.acquire('ok', { ttl: 1000 });
    await bad('ttl', () => lock.extend(0));
  });

  it('retry and autoExtend', async () => {
    await bad('retry.retries', () => locker.acquire('k', { ttl: 1000, retry: { retries: -1 } }));
    await bad('retry.delay', () => locker.acquire('k', { ttl: 1000, retry: { delay: -1 } }));
    await bad('retry.timeout', () => locker.acquire('k', { ttl: 1000, retry: { timeout: -5 } }));
    await bad('autoExtend.maxHold', () => locker.acquire('k', { ttl: 900, autoExtend: {} }));
    await bad('autoExtend.interval', () => locker.acquire('k', { ttl: 900, autoExtend: { interval: 451, maxHold: 5000 } }));
    await bad('retry.retries', () => new Locker({ adapter, retry: { retries: -2 } }));
  });

  it('adapters and options', async () => {
    await bad('adapter', () => new Locker({}));
    await bad('adapter', () => new Locker({ adapter: { acquire() {} } }));
    await bad('adapter', () => new Locker({ adapter: { acquire() {}, release() {}, extend() {}, isHeld: 1 } }));
    const unfenced = { acquire: async () => true, release: async () => true, extend: async () => true, isHeld: async () => true };
    await bad('fencing', () => new Locker({ adapter: unfenced, fencing: true }));
    await bad('onEvent', () => new Locker({ adapter, onEvent: 'x' }));
    await bad('keyPrefix', () => new Locker({ adapter, keyPrefix: 1 }));
  });

  it('nothing was taken by a refused call', async () => {
    assert.notEqual(await locker.tryAcquire('k', { ttl: 1000 }), null);
  });
});

describe('a Rust panic', () => {
  it('surfaces as an error and the process lives on', async () => {
    const native = createRequire(import.meta.url)('../../binding.js');
    assert.throws(() => native.panicSyncForTest(), /panic/);
    const r = native.panicForTest(1);
    assert.equal(r, -2);
    const err = native.takeError();
    assert.equal(err.code, 'LOCK_INTERNAL');
    assert.match(err.message, /deliberate panic/);
    const locker = new Locker({ adapter: new InMemoryAdapter() });
    assert.equal((await locker.acquire('after-panic', { ttl: 1000 })).state, 'held');
  });
});

describe('debugging', () => {
  // A paused server needs one of its own: skipped with LOCCO_TEST_REDIS_URL (a shared server).
  it('a BackendError names the operation and the key', { skip: Boolean(process.env.LOCCO_TEST_REDIS_URL) && 'pauses its Redis server' }, async () => {
    // A stopped Redis: every call fails with a timeout. (A JavaScript adapter's own errors
    // pass through untouched, so they are not named.)
    const { startRedis } = await import('../support/servers.mjs');
    const { RedisAdapter } = await import('locco-rs/redis');
    const redis = await startRedis();
    try {
      const adapter = new RedisAdapter({ url: redis.url, commandTimeout: 300, connectTimeout: 1000 });
      const locker = new Locker({ adapter, keyPrefix: 'app:', retry: { retries: 0 } });
      // One lock per call: a failed extension may end a lock, and a release then has nothing to do.
      const locks = [];
      for (let i = 0; i < 3; i++) locks.push(await locker.acquire(`named:${i}`, { ttl: 60_000 }));
      redis.pause();
      try {
        const acquired = await locker.acquire('other', { ttl: 200 }).catch((e) => e);
        assert.equal(acquired.code, 'LOCK_BACKEND', String(acquired));
        assert.equal(acquired.operation, 'acquire');
        assert.equal(acquired.key, 'app:other');
        const calls = [['extend', (l) => l.extend(10_000)], ['isHeld', (l) => l.isHeld()], ['release', (l) => l.release()]];
        for (const [i, [operation, call]] of calls.entries()) {
          const err = await call(locks[i]).catch((e) => e);
          assert.equal(err.code, 'LOCK_BACKEND', `${operation}: ${err}`);
          assert.equal(err.operation, operation);
          assert.equal(err.key, `app:named:${i}`);
          assert.match(err.message, new RegExp(`${operation} of "app:named:${i}"`));
        }
      } finally {
        redis.resume();
      }
    } finally {
      await redis.dispose();
    }
  });

  it('console.log and JSON show key, state, ttl, heldMs and fence, never the token', async () => {
    const { inspect } = await import('node:util');
    const locker = new Locker({ adapter: new InMemoryAdapter(), fencing: true });
    const lock = await locker.acquire('shown', { ttl: 5000 });
    for (const text of [inspect(lock), JSON.stringify(lock), inspect({ nested: lock }, { depth: 4 })]) {
      assert.doesNotMatch(text, new RegExp(lock.token));
      assert.match(text, /shown/);
      assert.match(text, /held/);
      assert.match(text, /5000/);
      assert.match(text, /fence/);
    }
    await lock.release();
    assert.doesNotMatch(inspect(lock), new RegExp(lock.token));
    assert.match(inspect(lock), /released/);
  });
});

describe('connection URLs', () => {
  it('a wrong URL is refused naming the part that is wrong, never the password', async () => {
    const { RedisAdapter } = await import('locco-rs/redis');
    const { PostgresAdapter } = await import('locco-rs/postgres');
    const { MongoAdapter } = await import('locco-rs/mongo');
    const cases = [
      [() => new RedisAdapter({ url: 'redis://u:pw-secret@127.0.0.1:notaport' }), 'url', /port "notaport".*1 to 65535/],
      [() => new RedisAdapter({ url: 'http://127.0.0.1:6379' }), 'url', /scheme "http:".*redis:\/\//],
      [() => new RedisAdapter({ url: 'redis://' }), 'url', /no host/],
      [() => new RedisAdapter({ urls: ['redis://127.0.0.1:7000', 'redis://127.0.0.1:99999'], cluster: true }), 'urls[1]', /port "99999"/],
      [() => new PostgresAdapter({ url: 'postgres://u:pw-secret@127.0.0.1:5x/db' }), 'url', /port "5x"/],
      [() => new PostgresAdapter({ url: 'mysql://u@127.0.0.1/db' }), 'url', /scheme "mysql:"/],
      [() => new MongoAdapter({ url: 'mongodb://u:pw-secret@127.0.0.1:27017,127.0.0.1:x/db' }), 'url', /port "x"/],
      [() => new MongoAdapter({ url: 'mongodb+srv://cluster.example:27017/db' }), 'url', /does not take/],
    ];
    for (const [make, field, message] of cases) {
      assert.throws(make, (e) => {
        assert.ok(e instanceof esm.ValidationError, String(e));
        assert.equal(e.field, field);
        assert.match(e.message, message);
        assert.doesNotMatch(e.message, /pw-secret/);
        return true;
      });
    }
  });
});

describe('stack traces', () => {
  it("a rejection that comes later keeps the caller's async frames", async () => {
    const adapter = new InMemoryAdapter();
    const locker = new Locker({ adapter, retry: { retries: 1, delay: 5 } });
    const held = await locker.acquire('busy', { ttl: 10_000 });
    // Options beyond the ttl take the full path, whose rejections carry the caller's frames;
    // acquire(key, { ttl }) and release() do not, for speed (see lib/native.js waitHot).
    async function chargeTheCustomerUnderLock() {
      await locker.acquire('busy', { ttl: 1000, retry: { retries: 1, delay: 5 } });
    }
    const err = await chargeTheCustomerUnderLock().catch((e) => e);
    assert.equal(err.code, 'LOCK_HELD', String(err));
    assert.match(err.stack, /at async chargeTheCustomerUnderLock/);
    assert.match(err.stack, /^LockHeldError: lock "busy"/);
    await held.release();
  });
});
