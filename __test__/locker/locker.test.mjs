import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import {
  Locker,
  LockHeldError,
  LockLostError,
  LockStateError,
  ValidationError,
  LoccoError,
  BackendError,
  exponentialBackoff,
} from 'locco-rs';
import { MongoAdapter } from 'locco-rs/mongo';
import { PostgresAdapter } from 'locco-rs/postgres';
import { RedisAdapter, RedlockAdapter } from 'locco-rs/redis';
import { ADAPTERS, sleep, until } from '../support/adapters.mjs';
import { startMongo, startPostgres, startRedis } from '../support/servers.mjs';
import { EtcdAdapter } from 'locco-rs/etcd';
import { startEtcd } from '../support/servers.mjs';

const redis = await startRedis();
const postgres = await startPostgres({ maxConnections: 300 }); // advisory adapters keep a connection per held lock
const mongo = await startMongo();
after(() => Promise.all([redis.dispose(), postgres.dispose(), mongo.dispose()]));
const redlockServers = await Promise.all([1, 2, 3].map(() => startRedis()));
after(() => Promise.all(redlockServers.map((s) => s.dispose())));
const etcd = await startEtcd();
after(() => etcd.dispose());
let tables = 0;
const ALL = [
  ...ADAPTERS,
  [
    'RedisAdapter',
    () => {
      redis.cli('FLUSHALL');
      return new RedisAdapter({ url: redis.url });
    },
  ],
  // Three independent servers; no fencing tokens (caps.fencing false).
  ['RedlockAdapter (3 servers)', () => (redlockServers.forEach((s) => s.cli('FLUSHALL')), new RedlockAdapter({ urls: redlockServers.map((s) => s.url) })), { fencing: false }],
  // A table of its own per test, so keys left held by one test do not meet the next.
  ['PostgresAdapter', () => new PostgresAdapter({ url: postgres.url, tableName: `locks_${++tables}`, poolSize: 4 })],
  ['PostgresAdapter (advisory)', () => new PostgresAdapter({ url: postgres.url, mode: 'advisory', tableName: `adv_${++tables}`, poolSize: 8 })],
  ['MongoAdapter', () => new MongoAdapter({ url: mongo.url, dbName: 'locker_tests', collectionName: `locks_${++tables}` })],
  // A prefix of its own per test, like the tables above.
  ['EtcdAdapter', () => new EtcdAdapter({ endpoints: [etcd.endpoint], prefix: `locker/${++tables}/` })],
];

/** Adapters that answer in this process, without a round trip. */
const inProcess = new Set(ADAPTERS.map(([name]) => name));

for (const [name, makeAdapter, caps = {}] of ALL) {
  describe(`Locker on ${name}`, () => {
    const setup = (opts = {}) => {
      const events = [];
      const adapter = makeAdapter();
      const locker = new Locker({ adapter, onEvent: (e) => events.push(e), ...opts, ...(caps.fencing === false && { fencing: false }) });
      return { adapter, locker, events };
    };

    it('acquires, reports the lock, and releases once', async () => {
      const { locker, events } = setup({ keyPrefix: 'p:' });
      const lock = await locker.acquire('k', { ttl: 5000 });
      assert.equal(lock.key, 'p:k');
      assert.equal(lock.state, 'held');
      assert.match(lock.token, /^[0-9a-f]{32}$/);
      assert.equal(lock.ttl, 5000);
      assert.equal(lock.fence, undefined);
      assert.deepEqual(lock.retry, { retries: 10, delay: 200, timeout: undefined, onBackendError: 'fail' });
      assert.equal(await lock.release(), true);
      assert.equal(lock.state, 'released');
      assert.equal(await lock.release(), false);
      const held = lock.heldMs;
      await sleep(30);
      assert.equal(lock.heldMs, held, 'heldMs stops at release');
      assert.deepEqual(
        events.map((e) => e.type),
        ['acquired', 'released'],
      );
      assert.equal(events[0].attempts, 1);
      assert.equal(typeof events[0].waitedMs, 'number');
      assert.equal(typeof events[1].heldMs, 'number');
    });

    it('is not re-entrant and tryAcquire answers null when held', async () => {
      const { locker, events } = setup();
      const lock = await locker.acquire('k', { ttl: 5000 });
      assert.equal(await locker.tryAcquire('k', { ttl: 5000 }), null);
      const contended = events.find((e) => e.type === 'contended');
      assert.equal(contended.reason, 'held');
      assert.equal(contended.attempt, 1);
      await lock.release();
      const again = await locker.tryAcquire('k', { ttl: 5000 });
      assert.equal(again.state, 'held');
    });

    it('gives up with LockHeldError after its retries', async () => {
      const { locker } = setup({ retry: { retries: 2, delay: 10 } });
      await locker.acquire('k', { ttl: 5000 });
      const err = await locker.acquire('k', { ttl: 5000 }).catch((e) => e);
      assert.ok(err instanceof LockHeldError);
      assert.ok(err instanceof LoccoError);
      assert.equal(err.code, 'LOCK_HELD');
      assert.equal(err.key, 'k');
      assert.equal(err.attempts, 3);
      assert.equal(err.reason, 'held');
      assert.ok(err.elapsedMs >= 15);
    });

    it('merges retry options per field and spends one timeout budget', async () => {
      const { locker } = setup({ retry: { retries: Infinity, delay: 20 } });
      await locker.acquire('k', { ttl: 5000 });
      const started = performance.now();
      const err = await locker.acquire('k', { ttl: 5000, retry: { timeout: 150 } }).catch((e) => e);
      const took = performance.now() - started;
      assert.ok(err instanceof LockHeldError);
      assert.ok(took >= 140 && took < 1500, `took ${took}`);
      assert.ok(err.attempts >= 3);
      // A lease long enough for a loaded machine: this checks the merged policy, not timing.
      const other = await locker.tryAcquire('other', { ttl: 2000 });
      assert.deepEqual(other.retry, { retries: Infinity, delay: 20, timeout: undefined, onBackendError: 'fail' });
      const lock = await locker.acquire('third', { ttl: 100, retry: { timeout: 9 } });
      assert.deepEqual(lock.retry, { retries: Infinity, delay: 20, timeout: 9, onBackendError: 'fail' });
    });

    it('calls an async DelayFn with attempt, elapsedMs and previousDelay', async () => {
      const { locker } = setup();
      await locker.acquire('k', { ttl: 5000 });
      const seen = [];
      const delay = async (input) => {
        seen.push(input);
        return 5;
      };
      await locker.acquire('k', { ttl: 5000, retry: { retries: 3, delay } }).catch(() => {});
      assert.equal(seen.length, 3);
      assert.deepEqual(
        seen.map((s) => s.attempt),
        [1, 2, 3],
      );
      assert.equal(seen[0].previousDelay, 0);
      assert.equal(seen[1].previousDelay, 5);
      assert.ok(seen[2].elapsedMs >= seen[1].elapsedMs);
    });

    it('exponentialBackoff grows and is checked', async () => {
      const b = exponentialBackoff({ base: 100, max: 1000, jitter: false });
      assert.deepEqual(
        [1, 2, 3, 4, 5].map((attempt) => b({ attempt, elapsedMs: 0, previousDelay: 0 })),
        [100, 200, 400, 800, 1000],
      );
      assert.throws(() => exponentialBackoff({ base: 100, max: 10 }), ValidationError);
      const { locker } = setup({ retry: { retries: 2, delay: exponentialBackoff({ base: 1, max: 4 }) } });
      await locker.acquire('k', { ttl: 5000 });
      assert.ok((await locker.acquire('k', { ttl: 5000 }).catch((e) => e)) instanceof LockHeldError);
    });

    it('wakes a waiter when the key is released, before its next poll', async () => {
      const { locker } = setup({ retry: { retries: 5, delay: 60_000 } });
      const first = await locker.acquire('k', { ttl: 5000 });
      const started = performance.now();
      const waiting = locker.acquire('k', { ttl: 5000 });
      setTimeout(() => first.release(), 20);
      const second = await waiting;
      assert.equal(second.state, 'held');
      assert.ok(performance.now() - started < 5000, 'woken by the release, not by a poll a minute later');
    });

    it('stops on an abort signal with signal.reason and gives the key back', async () => {
      const { locker } = setup({ retry: { retries: Infinity, delay: 50 } });
      const holder = await locker.acquire('k', { ttl: 5000 });
      const ac = new AbortController();
      const reason = new Error('caller gave up');
      const pending = locker.acquire('k', { ttl: 5000, signal: ac.signal });
      setTimeout(() => ac.abort(reason), 30);
      await assert.rejects(pending, (e) => e === reason);
      const already = AbortSignal.abort(reason);
      await assert.rejects(locker.acquire('free', { ttl: 5000, signal: already }), (e) => e === reason);
      assert.equal(await locker.tryAcquire('free', { ttl: 5000 }).then((l) => l.state), 'held');
      await holder.release();
    });

    it('throws late-acquire from tryAcquire when the grant came after the lease', async () => {
      let t = 0;
      const { locker, events, adapter } = setup({ now: () => (t += 1000) });
      const err = await locker.tryAcquire('k', { ttl: 1000 }).catch((e) => e);
      if (inProcess.has(name)) {
        // The grant arrives (within the call in memory, a turn later from the JavaScript
        // adapter) on a clock already past the lease: late, given back.
        assert.ok(err instanceof LockHeldError, String(err));
        assert.equal(err.reason, 'late-acquire');
        assert.equal(events.find((e) => e.type === 'contended').reason, 'late');
      } else {
        // This clock passes every deadline at its next reading, before a round trip can
        // answer: no answer at all is a backend timeout, never contention.
        assert.ok(err instanceof BackendError, String(err));
        assert.equal(err.kind, 'timeout');
      }
      // The grant was given back (over the network this takes a round trip).
      const plain = new Locker({ adapter, retry: { retries: 20, delay: 10 } });
      assert.equal((await plain.acquire('k', { ttl: 1000 })).state, 'held');
    });

    it('reads state on the clock, without waiting for a timer', async () => {
      let t = 0;
      const { locker } = setup({ now: () => t });
      const lock = await locker.acquire('k', { ttl: 1000 });
      t = 989;
      assert.equal(lock.state, 'held');
      t = 990;
      assert.equal(lock.state, 'lost');
      assert.equal(lock.lostReason, 'expired');
      assert.equal(lock.heldMs, 990);
      assert.ok(lock.signal.aborted);
      assert.ok(lock.signal.reason instanceof LockLostError);
      assert.equal(lock.signal.reason.reason, 'expired');
      await assert.rejects(lock.extend(1000), (e) => e instanceof LockLostError && e.reason === 'expired');
    });

    it('aborts lock.signal from a timer when the lease runs out', async () => {
      const { locker, events } = setup();
      const lock = await locker.acquire('k', { ttl: 100 });
      const signal = lock.signal;
      assert.equal(signal.aborted, false);
      await until(() => signal.aborted, 3000);
      assert.equal(signal.reason.code, 'LOCK_LOST');
      assert.equal(signal.reason.reason, 'expired');
      assert.equal(events.filter((e) => e.type === 'lost').length, 1);
      await sleep(100); // the local lease ends 1% early; let the backend's end pass too
      assert.equal(await lock.release(), false);
      assert.equal(events.filter((e) => e.type === 'lost' || e.type === 'released').length, 1, 'one ending');
    });

    it('extends on a heartbeat and ends at maxHold', async () => {
      const { locker, events } = setup();
      // A ttl of 1 s leaves each heartbeat 2/3 s to land: with 300 ms a slow server on a busy
      // machine (MongoDB in CI) let a lease run out first, and the lock ended 'expired'.
      const lock = await locker.acquire('k', { ttl: 1000, autoExtend: { maxHold: 2000 } });
      await sleep(1200);
      assert.equal(lock.state, 'held');
      assert.ok(events.some((e) => e.type === 'extended'));
      await until(() => lock.state === 'lost', 5000);
      assert.equal(lock.lostReason, 'max-hold');
      assert.ok(lock.heldMs <= 2000);
      assert.equal(lock.signal.reason.reason, 'max-hold');
    });

    it('extend renews the lease and clamps to maxHold', async () => {
      const { locker, events } = setup();
      const lock = await locker.acquire('k', { ttl: 1000, autoExtend: { maxHold: 60_000, interval: 300 } });
      await lock.extend(5000);
      assert.equal(lock.ttl, 5000);
      assert.ok(events.some((e) => e.type === 'extended'));
      await lock.release();
      await assert.rejects(lock.extend(100), LockStateError);
    });

    it('isHeld observes a key taken away', async () => {
      const { locker, adapter } = setup();
      const lock = await locker.acquire('k', { ttl: 5000 });
      assert.equal(await lock.isHeld(), true);
      await adapter.release({ key: 'k', token: lock.token });
      assert.equal(await lock.isHeld(), false);
      assert.equal(lock.lostReason, 'observed');
      assert.equal(lock.signal.reason.reason, 'observed');
    });

    it('a release that finds the key gone reports lost (release)', async () => {
      const { locker, adapter, events } = setup();
      const lock = await locker.acquire('k', { ttl: 5000 });
      await adapter.release({ key: 'k', token: lock.token });
      assert.equal(await lock.release(), false);
      assert.equal(lock.lostReason, 'release');
      assert.equal(events.at(-1).type, 'lost');
      assert.equal(events.at(-1).reason, 'release');
    });

    it('works with await using', async () => {
      const { locker } = setup();
      let inner;
      {
        await using lock = await locker.acquire('k', { ttl: 5000 });
        inner = lock;
        assert.equal(lock.state, 'held');
      }
      assert.equal(inner.state, 'released');
      {
        await using set = await locker.acquireMany(['a', 'b'], { ttl: 5000 });
        assert.equal(set.locks.length, 2);
      }
      assert.notEqual(await locker.tryAcquire('a', { ttl: 100 }), null);
    });

    it('withLock returns the value, throws the callback error, or LockLostError', async () => {
      const { locker } = setup();
      assert.equal(await locker.withLock('k', { ttl: 5000 }, async () => 42), 42);
      const boom = new Error('boom');
      await assert.rejects(
        locker.withLock('k', { ttl: 5000 }, async () => {
          throw boom;
        }),
        (e) => e === boom,
      );
      assert.notEqual(await locker.tryAcquire('k', { ttl: 100 }), null, 'released after a throw');
      const err = await locker
        .withLock('w', { ttl: 100 }, async () => {
          await sleep(250);
          return 'done late';
        })
        .catch((e) => e);
      assert.ok(err instanceof LockLostError);
      assert.equal(err.completed, true);
      assert.equal(err.result, 'done late');
      assert.equal(err.reason, 'expired');
      const released = await locker.withLock('x', { ttl: 5000 }, async (lock) => {
        await lock.release();
        return 'self-released';
      });
      assert.equal(released, 'self-released');
    });

    it('acquireMany dedupes, sorts, and gives everything back on failure', async () => {
      const { locker } = setup({ keyPrefix: 'm:' });
      const set = await locker.acquireMany(['b', 'a', 'b'], { ttl: 5000 });
      assert.deepEqual(
        set.locks.map((l) => l.key),
        ['m:a', 'm:b'],
      );
      assert.equal(set.signal.aborted, false);
      await set.extend(6000);
      assert.equal(await set.release(), true);
      const blocker = await locker.acquire('c', { ttl: 5000 });
      await assert.rejects(locker.acquireMany(['a', 'c'], { ttl: 5000, retry: { retries: 0 } }), LockHeldError);
      assert.notEqual(await locker.tryAcquire('a', { ttl: 100 }), null, 'a was released again');
      await blocker.release();
    });

    it('hands out fencing tokens that grow per key', { skip: caps.fencing === false && 'no fencing tokens' }, async () => {
      const { locker } = setup({ fencing: true });
      const fences = [];
      for (let i = 0; i < 3; i++) {
        const lock = await locker.acquire('f', { ttl: 5000 });
        fences.push(lock.fence);
        await lock.release();
      }
      assert.ok(fences.every((f, i) => Number.isInteger(f) && (i === 0 || f > fences[i - 1])), String(fences));
    });

    it('a released lock answers from the facade once the engine has forgotten it', async () => {
      const { locker } = setup({ fencing: true });
      const lock = await locker.acquire('gone', { ttl: 5000 });
      const { token, fence } = lock;
      await sleep(5);
      assert.equal(await lock.release(), true);
      assert.notEqual(lock._end, undefined, 'the engine forgot the lock');
      assert.equal(lock.state, 'released');
      assert.equal(lock.lostReason, undefined);
      assert.equal(lock.token, token);
      assert.equal(lock.fence, fence);
      assert.equal(lock.ttl, 5000);
      assert.ok(lock.heldMs >= 4, String(lock.heldMs));
      assert.equal(lock.signal.aborted, false);
      assert.equal(await lock.isHeld(), false);
      assert.equal(await lock.release(), false);
      await assert.rejects(lock.extend(1000), LockStateError);
      // A new holder of the key is not disturbed by the old lock.
      const next = await locker.acquire('gone', { ttl: 5000 });
      await lock[Symbol.asyncDispose]();
      assert.equal(await next.isHeld(), true);
      await next.release();
    });

    it('drops what onEvent throws', async () => {
      const { locker } = setup({
        onEvent: () => {
          throw new Error('handler bug');
        },
      });
      const lock = await locker.acquire('k', { ttl: 5000 });
      assert.equal(await lock.release(), true);
    });

    it('uses an injected token', async () => {
      let n = 0;
      const { locker } = setup({ token: () => `tok-${++n}` });
      const lock = await locker.acquire('k', { ttl: 5000 });
      assert.equal(lock.token, 'tok-1');
    });
  });
}
