import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BackendError, Locker, LockHeldError, ValidationError } from 'locco-rs';
import { MapAdapter, QueuedMapAdapter } from '../support/map-adapter.mjs';
import { sleep, until } from '../support/adapters.mjs';

class Oops {}

describe('an adapter written in JavaScript', () => {
  it('passes what it throws through untouched, never as contention', async () => {
    const thrown = new Oops();
    const adapter = new MapAdapter();
    adapter.acquire = async () => {
      throw thrown;
    };
    const locker = new Locker({ adapter });
    const err = await locker.acquire('k', { ttl: 1000 }).catch((e) => e);
    assert.equal(err, thrown);
    const sync = new MapAdapter();
    sync.acquire = () => {
      throw 'a string';
    };
    const s = await new Locker({ adapter: sync }).tryAcquire('k', { ttl: 1000 }).catch((e) => e);
    assert.equal(s, 'a string');
  });

  it('cannot hang acquire past retry.timeout with a promise that never settles', async () => {
    const adapter = new MapAdapter();
    adapter.acquire = () => new Promise(() => {});
    const locker = new Locker({ adapter });
    const started = performance.now();
    const err = await locker.acquire('k', { ttl: 10_000, retry: { timeout: 200, retries: 0 } }).catch((e) => e);
    const took = performance.now() - started;
    // No answer at all is a backend timeout, not contention.
    assert.ok(err instanceof BackendError, String(err));
    assert.equal(err.kind, 'timeout');
    assert.match(err.message, /"k"/);
    assert.ok(took < 2000, `took ${took} ms`);
  });

  it('cannot hang a heartbeat past the lease', async () => {
    const adapter = new MapAdapter();
    const locker = new Locker({ adapter });
    const lock = await locker.acquire('k', { ttl: 300, autoExtend: { maxHold: 60_000 } });
    adapter.extend = () => new Promise(() => {});
    await until(() => lock.state === 'lost', 3000);
    assert.equal(lock.lostReason, 'late-extend');
  });

  it('keeps the lock when an extension throws, and reports extendFailed', async () => {
    const adapter = new MapAdapter();
    const events = [];
    const locker = new Locker({ adapter, onEvent: (e) => events.push(e) });
    const lock = await locker.acquire('k', { ttl: 600, autoExtend: { maxHold: 60_000 } });
    const failure = new Error('backend hiccup');
    const realExtend = adapter.extend.bind(adapter);
    adapter.extend = async () => {
      throw failure;
    };
    await until(() => events.some((e) => e.type === 'extendFailed'), 3000);
    assert.equal(lock.state, 'held');
    assert.equal(events.find((e) => e.type === 'extendFailed').error, failure);
    adapter.extend = realExtend;
    await until(() => events.some((e) => e.type === 'extended'), 3000);
    assert.equal(lock.state, 'held');
    await lock.release();
  });

  it('a wrong answer type is a BackendError, not contention', async () => {
    const adapter = new MapAdapter();
    adapter.acquire = async () => 'yes';
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 1000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND');
    assert.equal(err.kind, 'protocol');
  });

  it('fences through acquireFenced', async () => {
    const locker = new Locker({ adapter: new MapAdapter(), fencing: true });
    const a = await locker.acquire('f', { ttl: 1000 });
    await a.release();
    const b = await locker.acquire('f', { ttl: 1000 });
    assert.ok(b.fence > a.fence);
    await sleep(1);
  });
});

describe('a JavaScript adapter with the queue methods', () => {
  it('hands a key over in request order, by its push, not the retry delay', async () => {
    const adapter = new QueuedMapAdapter();
    const [a, b] = [new Locker({ adapter }), new Locker({ adapter })];
    const retry = { retries: Infinity, delay: 5000, timeout: 20_000 };
    const held = await a.acquire('k', { ttl: 10_000 });
    const order = [];
    const waits = [b, a, b].map((locker, i) =>
      locker.acquire('k', { ttl: 10_000, retry }).then(async (lock) => {
        order.push(i);
        await new Promise((r) => setTimeout(r, 5));
        await lock.release();
      }),
    );
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(await a.tryAcquire('k', { ttl: 1000 }), null);
    const started = performance.now();
    await held.release();
    await Promise.all(waits);
    assert.deepEqual(order, [0, 1, 2]);
    assert.ok(performance.now() - started < 2000, 'pushed: far less than one 5 s delay');
  });

  it('an aborted waiter leaves the queue at once', async () => {
    const adapter = new QueuedMapAdapter();
    const locker = new Locker({ adapter });
    const held = await locker.acquire('k', { ttl: 10_000 });
    const ac = new AbortController();
    const gone = locker.acquire('k', { ttl: 1000, signal: ac.signal, retry: { retries: Infinity } }).catch((e) => e);
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(adapter.queues.get('k').length, 1);
    ac.abort();
    await gone;
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(adapter.queues.get('k').length, 0);
    await held.release();
  });

  it('refuses an adapter with only some of the queue methods, naming what is missing', () => {
    const adapter = new MapAdapter();
    adapter.acquireQueued = async () => ({ granted: true });
    assert.throws(
      () => new Locker({ adapter }),
      (e) => e instanceof ValidationError && e.field === 'adapter' && /leaveQueue/.test(e.message) && /watchQueue/.test(e.message),
    );
  });

  it('an answer outside the protocol is an error of the adapter, not a grant', async () => {
    const adapter = new QueuedMapAdapter();
    adapter.acquireQueued = async () => ({ granted: 'yes' });
    const locker = new Locker({ adapter });
    // A free key is taken by a plain acquire; the queue is asked only once it is taken.
    const held = await locker.acquire('k', { ttl: 1000 });
    await assert.rejects(locker.acquire('k', { ttl: 1000 }), /acquireQueued .* answered no \{ granted \}/);
    await held.release();
  });
});

describe('a grant that arrives after its lease ended', () => {
  /**
   * A MapAdapter (on its own clock) whose request takes longer than the lease on the Locker's
   * clock: the first `late` acquires move the Locker's injected clock past the lease before
   * they answer "granted".
   */
  function slowGrants(late) {
    let offset = 0;
    const now = () => performance.now() + offset;
    const adapter = new MapAdapter();
    const grant = adapter.acquire.bind(adapter);
    const releases = [];
    const release = adapter.release.bind(adapter);
    adapter.release = (input) => {
      releases.push(input.token);
      return release(input);
    };
    adapter.acquire = (input) => {
      if (late-- > 0) offset += input.ttl * 2;
      return grant(input);
    };
    return { adapter, now, releases };
  }

  it('tryAcquire gives the key back and throws LockHeldError with reason late-acquire', async () => {
    const { adapter, now, releases } = slowGrants(1);
    const events = [];
    const locker = new Locker({ adapter, now, onEvent: (e) => events.push(e) });
    const err = await locker.tryAcquire('late', { ttl: 1000 }).catch((e) => e);
    assert.ok(err instanceof LockHeldError, String(err));
    assert.equal(err.reason, 'late-acquire');
    assert.deepEqual(
      events.filter((e) => e.type === 'contended').map((e) => e.reason),
      ['late'],
    );
    await until(() => releases.length > 0);
    assert.equal(adapter.entries.size, 0, 'the late grant was not given back');
  });

  it('acquire emits contended with reason late and retries', async () => {
    const { adapter, now } = slowGrants(1);
    const events = [];
    const locker = new Locker({ adapter, now, onEvent: (e) => events.push(e) });
    const lock = await locker.acquire('late', { ttl: 1000, retry: { retries: 3, delay: 10 } });
    assert.equal(lock.state, 'held');
    const contended = events.filter((e) => e.type === 'contended');
    assert.deepEqual(contended.map((e) => e.reason), ['late']);
    assert.equal(events.find((e) => e.type === 'acquired').attempts, 2);
    await until(() => adapter.entries.size === 1);
    assert.equal(await adapter.isHeld({ key: 'late', token: lock.token }), true);
    await lock.release();
  });

  it('an attempt that got no answer at all is still a BackendError timeout', async () => {
    const { adapter, now } = slowGrants(1);
    adapter.acquire = () => new Promise(() => {});
    const locker = new Locker({ adapter, now });
    const err = await locker.tryAcquire('silent', { ttl: 100 }).catch((e) => e);
    assert.ok(err instanceof BackendError, String(err));
    assert.equal(err.kind, 'timeout');
  });
});
