import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  MutexManager,
  MutexTimeoutError,
  MutexAbortedError,
  MutexDeadlockError,
  DistributedLockError,
  LockExtensionError,
} from 'locco-rs/mutex';
import { ValidationError } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { startRedis } from '../support/servers.mjs';
import { MapAdapter } from '../support/map-adapter.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

describe('MutexManager in one process', () => {
  it('serialises operations per id, in arrival order, and passes their context', async () => {
    const m = new MutexManager();
    const order = [];
    let running = 0;
    const op = (n) =>
      m.runOperation('a', async ({ currentMutex, heldMutexIds, contextToken, abortSignal, requestTime, startTime }) => {
        running++;
        assert.equal(running, 1);
        assert.equal(currentMutex.id, 'a');
        assert.equal(currentMutex.isLocked, true);
        assert.deepEqual(heldMutexIds, ['a']);
        assert.equal(typeof contextToken.id, 'string');
        assert.equal(abortSignal.aborted, false);
        assert.ok(startTime >= requestTime);
        await sleep(5);
        order.push(n);
        running--;
        return n;
      });
    const results = await Promise.all([op(1), op(2), op(3)]);
    assert.deepEqual(order, [1, 2, 3]);
    assert.deepEqual(results, [1, 2, 3]);
  });

  it('waitIfLocked: false skips the callback and resolves undefined', async () => {
    const m = new MutexManager();
    let ran = false;
    const holder = m.runOperation('a', () => sleep(30));
    const skipped = await m.runOperation('a', () => (ran = true), { waitIfLocked: false });
    assert.equal(skipped, undefined);
    assert.equal(ran, false);
    await holder;
  });

  it('times out a queued operation and removes it; 0 is one immediate attempt', async () => {
    const m = new MutexManager();
    const holder = m.runOperation('a', () => sleep(100));
    let ran = false;
    await assert.rejects(m.runOperation('a', () => (ran = true), { timeoutMs: 20 }), (e) => e instanceof MutexTimeoutError && e.timeoutMs === 20);
    await assert.rejects(m.runOperation('a', () => {}, { timeoutMs: 0 }), MutexTimeoutError);
    await holder;
    assert.equal(ran, false, 'the timed-out operation never ran');
    assert.equal(await m.runOperation('a', () => 'free again'), 'free again');
  });

  it('aborts a queued operation through signal or onAbort, and the running one at once', async () => {
    const m = new MutexManager();
    const holder = m.runOperation('a', () => sleep(50));
    const ac = new AbortController();
    const queued = m.runOperation('a', () => {}, { signal: ac.signal });
    ac.abort(new Error('no longer needed'));
    await assert.rejects(queued, (e) => e instanceof MutexAbortedError && e.reason.message === 'no longer needed');
    let cancel;
    const hooked = m.runOperation('a', () => {}, { onAbort: (abort) => (cancel = abort) });
    cancel('bye');
    await assert.rejects(hooked, (e) => e instanceof MutexAbortedError && e.reason === 'bye');
    await holder;
    const running = new AbortController();
    let sawAbort;
    const seen = m.runOperation('a', async ({ abortSignal }) => {
      await sleep(20);
      sawAbort = abortSignal.aborted;
    }, { signal: running.signal });
    setTimeout(() => running.abort('stop'), 5);
    await assert.rejects(seen, (e) => e instanceof MutexAbortedError && e.reason === 'stop');
    assert.equal(sawAbort, undefined, 'the caller heard of the abort before the callback ended');
    await m.runOperation('a', () => {});
    assert.equal(sawAbort, true, 'the mutex stayed held until the callback ended');
  });

  it('propagates callback errors and frees the mutex', async () => {
    const m = new MutexManager();
    const boom = new Error('boom');
    await assert.rejects(m.runOperation('a', () => { throw boom; }), (e) => e === boom);
    assert.equal(await m.runOperation('a', () => 'next'), 'next');
  });

  it('is re-entrant within one async call chain, and by explicit context', async () => {
    const m = new MutexManager();
    const inner = await m.runOperation('a', async ({ contextToken }) => {
      assert.equal(m.getCurrentContext(), contextToken);
      const nested = await m.runOperation('a', async () => 'nested ran');
      const viaTimer = await new Promise((resolve) =>
        setTimeout(() => resolve(m.runOperation('a', () => 'timer ran', { context: contextToken })), 0),
      );
      return [nested, viaTimer];
    });
    assert.deepEqual(inner, ['nested ran', 'timer ran']);
    assert.equal(m.isAsyncContextTrackingSupported(), true);
    assert.ok(m.createContext().id);
  });

  it('reports a deadlock at once, with the cycle, whatever the timeout', async () => {
    const m = new MutexManager();
    let release;
    const gate = new Promise((r) => (release = r));
    const first = m.runOperation('alpha', async () => {
      await gate;
      return m.runOperation('beta', () => 'first got beta');
    });
    const second = m.runOperation('beta', async () => {
      await sleep(10);
      release();
      await sleep(10);
      return m.runOperation('alpha', () => 'second got alpha');
    });
    const results = await Promise.allSettled([first, second]);
    const failed = results.filter((r) => r.status === 'rejected');
    assert.equal(failed.length, 1);
    assert.ok(failed[0].reason instanceof MutexDeadlockError);
    assert.equal(failed[0].reason.cycle.length, 3);
    assert.equal(failed[0].reason.cycle[0], failed[0].reason.cycle[2]);
    assert.deepEqual([...failed[0].reason.cycle].sort(), ['alpha', 'beta', failed[0].reason.requestedId].sort());
  });

  it('checks its options', () => {
    assert.throws(() => new MutexManager({ adapter: new InMemoryAdapter(), lockTTL: 0 }), ValidationError);
    assert.throws(() => new MutexManager({ adapter: new InMemoryAdapter(), lockTTL: 1000, lockExtendInterval: 1000 }), ValidationError);
    assert.throws(() => new MutexManager({ coordinationFailureMode: 'maybe' }), ValidationError);
  });
});

describe('MutexManager leases', () => {
  it('a lost lease aborts the callback and makes assertLock throw LockExtensionError', async () => {
    const adapter = new InMemoryAdapter();
    const m = new MutexManager({ adapter, lockTTL: 150, lockExtendInterval: 0 });
    const seen = await m.runOperation('lease', async ({ abortSignal, assertLock }) => {
      assertLock();
      await sleep(400);
      let thrown;
      try {
        assertLock();
      } catch (e) {
        thrown = e;
      }
      return { aborted: abortSignal.aborted, thrown };
    });
    assert.equal(seen.aborted, true);
    assert.ok(seen.thrown instanceof LockExtensionError, String(seen.thrown));
    assert.equal(seen.thrown.code, 'MUTEX_LOCK_EXTENSION');
  });

  it('a re-entered mutex gets assertLock and the abort signal of the outer lease', async () => {
    const m = new MutexManager({ adapter: new InMemoryAdapter(), lockTTL: 150, lockExtendInterval: 0 });
    const seen = await m.runOperation('outer', async () =>
      m.runOperation('outer', async ({ assertLock, abortSignal }) => {
        assert.equal(typeof assertLock, 'function', 'a nested call has assertLock too');
        assertLock();
        await sleep(400);
        let thrown;
        try {
          assertLock();
        } catch (e) {
          thrown = e;
        }
        return { aborted: abortSignal.aborted, thrown };
      }),
    );
    assert.ok(seen.thrown instanceof LockExtensionError, String(seen.thrown));
    assert.equal(seen.aborted, true);
  });

  it('renews the lease while the work runs', async () => {
    const m = new MutexManager({ adapter: new InMemoryAdapter(), lockTTL: 150, lockExtendInterval: 50 });
    const ok = await m.runOperation('renewed', async ({ assertLock }) => {
      await sleep(400);
      assertLock();
      return true;
    });
    assert.equal(ok, true);
  });

  it('dispose() closes only what the manager owns', async () => {
    let closed = false;
    const adapter = new InMemoryAdapter();
    adapter.close = async () => {
      closed = true;
    };
    const m = new MutexManager({ adapter });
    await m.dispose();
    assert.equal(closed, false, "a caller's adapter stays open");
  });
});

describe('MutexManager over an adapter without coordination records', () => {
  it('strict mode refuses a nested distributed wait; best-effort proceeds', async () => {
    const adapter = new MapAdapter();
    const strict = new MutexManager({ adapter, lockTTL: 2000 });
    const other = new MutexManager({ adapter, lockTTL: 2000 });
    const lenient = new MutexManager({ adapter, lockTTL: 2000, coordinationFailureMode: 'best-effort' });
    const holder = other.runOperation('b', () => sleep(60));
    await sleep(10);
    await assert.rejects(strict.runOperation('a', () => strict.runOperation('b', () => {})), DistributedLockError);
    assert.equal(await lenient.runOperation('c', () => lenient.runOperation('b', () => 'waited')), 'waited');
    await holder;
  });
});

describe('MutexManager across managers', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis.dispose());

  it('[Symbol.asyncDispose] closes what the manager owns, as dispose() does', async () => {
    const m = new MutexManager({ redis: { url: redis.url }, namespace: 'disposed' });
    assert.equal(await m.runOperation('x', () => 1), 1);
    await m[Symbol.asyncDispose]();
    await assert.rejects(m.runOperation('x', () => 2));
  });

  for (const [name, make] of [
    ['a shared InMemoryAdapter', () => {
      const adapter = new InMemoryAdapter();
      return () => new MutexManager({ adapter, namespace: 'ns', lockTTL: 2000 });
    }],
    ['Redis (redis: { url } shorthand)', () => () => new MutexManager({ redis: { url: redis.url }, namespace: 'ns', lockTTL: 2000 })],
  ]) {
    describe(name, () => {
      it('serialises across managers and honours waitIfLocked: false', async () => {
        const factory = make();
        const [m1, m2] = [factory(), factory()];
        let running = 0;
        let overlap = false;
        const op = async ({ assertLock }) => {
          assertLock();
          running++;
          if (running > 1) overlap = true;
          await sleep(20);
          running--;
        };
        await Promise.all([m1.runOperation('x', op), m2.runOperation('x', op), m1.runOperation('x', op)]);
        assert.equal(overlap, false);
        const holder = m1.runOperation('y', () => sleep(50));
        await sleep(10);
        assert.equal(await m2.runOperation('y', () => 'ran', { waitIfLocked: false }), undefined);
        await assert.rejects(m2.runOperation('y', () => {}, { timeoutMs: 20 }), MutexTimeoutError);
        await holder;
        await m1.dispose();
        await m2.dispose();
      });

      it('a nested wait across managers proceeds, and a deadlock between them is reported with its cycle', async () => {
        const factory = make();
        const [m1, m2] = [factory(), factory()];
        const holder = m2.runOperation('b', () => sleep(60));
        await sleep(10);
        assert.equal(await m1.runOperation('a', () => m1.runOperation('b', () => 'nested')), 'nested');
        await holder;
        let go;
        const both = new Promise((r) => (go = r));
        const started = performance.now();
        const results = await Promise.allSettled([
          m1.runOperation('alpha', async () => {
            await both;
            return m1.runOperation('beta', () => 'm1 got beta');
          }),
          m2.runOperation('beta', async () => {
            go();
            await sleep(5);
            return m2.runOperation('alpha', () => 'm2 got alpha');
          }),
        ]);
        const failed = results.filter((r) => r.status === 'rejected').map((r) => r.reason);
        assert.equal(failed.length, 1, String(failed));
        assert.ok(failed[0] instanceof MutexDeadlockError, String(failed[0]));
        assert.equal(failed[0].cycle[0], failed[0].cycle.at(-1));
        assert.deepEqual(new Set(failed[0].cycle), new Set(['alpha', 'beta']));
        assert.ok(performance.now() - started < 1000, 'reported within a second');
        await m1.dispose();
        await m2.dispose();
      });
    });
  }
});
