import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BackendError, Locker } from 'locco-rs';
import { MapAdapter } from './support/map-adapter.mjs';
import { sleep, until } from './support/adapters.mjs';

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
