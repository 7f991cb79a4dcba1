// MutexManager against the behaviour its manual (the mutex manager seed) describes, one block
// per point where a drop-in replacement must match it. Names are the manual's.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MutexManager, MutexAbortedError, MutexDeadlockError, MutexTimeoutError } from 'locco-rs/mutex';
import { RedisAdapter } from 'locco-rs/redis';
import { MapAdapter } from '../support/map-adapter.mjs';
import { startRedis } from '../support/servers.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const until = async (ok, ms = 5000) => {
  for (const end = Date.now() + ms; !ok(); await sleep(5)) if (Date.now() > end) throw new Error('condition not met in time');
};
/** A promise and the function that settles it. */
const gate = () => {
  let open;
  const opened = new Promise((r) => (open = r));
  return { opened, open };
};

describe('heldMutexIds', () => {
  it('is an array (readonly in the types) of the ids the call context owns', async () => {
    const m = new MutexManager();
    const seen = await m.runOperation('outer', () =>
      m.runOperation('inner', ({ heldMutexIds }) => heldMutexIds),
    );
    expect(seen).toEqual(['outer', 'inner']);
    expect(Array.isArray(seen)).toBe(true);
    expect(seen.join(',')).toBe('outer,inner');
  });
});

describe('an abort while the callback runs', () => {
  it('rejects the caller at once with MutexAbortedError, and keeps the mutex until the callback settles', async () => {
    const m = new MutexManager();
    const ac = new AbortController();
    const done = gate();
    let callbackSignal;
    const running = m.runOperation(
      'job',
      async ({ abortSignal }) => {
        callbackSignal = abortSignal;
        await done.opened;
        return 'finished';
      },
      { signal: ac.signal },
    );
    await sleep(5);
    const reason = new Error('user cancelled');
    ac.abort(reason);
    const error = await running.catch((e) => e);
    expect(error).toBeInstanceOf(MutexAbortedError);
    expect(error.id).toBe('job');
    expect(error.reason).toBe(reason);
    expect(callbackSignal.aborted).toBe(true);
    // Still held: the next operation waits for the callback, not for the caller.
    let nextRan = false;
    const next = m.runOperation('job', () => (nextRan = true));
    await sleep(20);
    expect(nextRan).toBe(false);
    done.open();
    await next;
    expect(nextRan).toBe(true);
  });

  it('a callback that ends before the abort resolves as usual', async () => {
    const m = new MutexManager();
    const ac = new AbortController();
    await expect(m.runOperation('job', async () => 'value', { signal: ac.signal })).resolves.toBe('value');
    ac.abort();
  });
});

describe('deadlock detection with a shared manual context', () => {
  it('concurrent branches that reuse one context make no false cycle', async () => {
    const m = new MutexManager();
    const [a, b] = [m.createContext(), m.createContext()];
    const holdA = gate();
    const holdB = gate();
    const holdingA = m.runOperation('alpha', () => holdA.opened, { context: a });
    const holdingB = m.runOperation('beta', () => holdB.opened, { context: b });
    await sleep(5);
    // A second task on context B waits for alpha; it holds nothing itself.
    const bWaits = m.runOperation('alpha', () => 'b got alpha', { context: b });
    await sleep(5);
    // A task on A asks for beta: beta's holder is not waiting for anything, so no deadlock.
    const aWaits = m.runOperation('beta', () => 'a got beta', { context: a });
    setTimeout(() => {
      holdA.open();
      holdB.open();
    }, 20);
    await expect(aWaits).resolves.toBe('a got beta');
    await expect(bWaits).resolves.toBe('b got alpha');
    await Promise.all([holdingA, holdingB]);
  });

  it('still reports the real cycle, with the manual ids', async () => {
    const m = new MutexManager();
    const bothHold = gate();
    let holders = 0;
    const held = () => ++holders === 2 && bothHold.open();
    const first = m.runOperation('alpha', async () => {
      held();
      await bothHold.opened;
      return m.runOperation('beta', () => 'first');
    });
    const second = m.runOperation('beta', async () => {
      held();
      await bothHold.opened;
      await sleep(5);
      return m.runOperation('alpha', () => 'second');
    });
    const [r1, r2] = await Promise.allSettled([first, second]);
    expect(r1.status).toBe('fulfilled');
    expect(r2.reason).toBeInstanceOf(MutexDeadlockError);
    expect(r2.reason.requestedId).toBe('alpha');
    expect(r2.reason.cycle).toEqual(['alpha', 'beta', 'alpha']);
  });
});

describe('options and defaults', () => {
  it('lockTTL defaults to 30000 ms and the lease is renewed every lockTTL/2', async () => {
    const adapter = new MapAdapter();
    const calls = [];
    for (const verb of ['acquire', 'extend']) {
      const original = adapter[verb].bind(adapter);
      adapter[verb] = (args) => {
        calls.push({ verb, ttl: args.ttl, at: performance.now() });
        return original(args);
      };
    }
    await new MutexManager({ adapter }).runOperation('ttl', () => {});
    expect(calls[0]).toMatchObject({ verb: 'acquire', ttl: 30_000 });
    calls.length = 0;
    await new MutexManager({ adapter, lockTTL: 3000 }).runOperation('renew', () => sleep(2000));
    const [acquired, extended] = calls;
    // A third of the TTL would renew at ~1000 ms, half at ~1500 ms (a loaded machine is late).
    expect(extended?.verb).toBe('extend');
    expect(extended.at - acquired.at).toBeGreaterThan(1250);
    expect(extended.at - acquired.at).toBeLessThan(2900);
  });
});

describe('async context tracking turned off', () => {
  it('isAsyncContextTrackingSupported() says so, and the contextToken carries ownership by hand', async () => {
    const m = new MutexManager({ asyncContextTracking: false });
    expect(m.isAsyncContextTrackingSupported()).toBe(false);
    expect(new MutexManager().isAsyncContextTrackingSupported()).toBe(true);
    const result = await m.runOperation('primary', async ({ contextToken }) => {
      expect(m.getCurrentContext()).toBe(contextToken);
      await sleep(1);
      // After an async hop the manager cannot tell the chain: no context, no re-entry.
      expect(m.getCurrentContext()).toBeUndefined();
      await expect(m.runOperation('primary', () => 'x', { timeoutMs: 30 })).rejects.toBeInstanceOf(MutexTimeoutError);
      // With the token passed by hand, the nested call re-enters.
      return m.runOperation(
        'secondary',
        ({ contextToken: nested }) => {
          expect(nested).toBe(contextToken);
          return m.runOperation('primary', () => 'nested ran', { context: nested });
        },
        { context: contextToken },
      );
    });
    expect(result).toBe('nested ran');
  });

  it('a wait counts only the holds its context had when it began', async () => {
    const m = new MutexManager({ asyncContextTracking: false });
    const [a, b] = [m.createContext(), m.createContext()];
    const holdA = gate();
    const holdB = gate();
    const holdingA = m.runOperation('alpha', () => holdA.opened, { context: a });
    await sleep(2);
    // B waits for alpha while it holds nothing ...
    const bWaits = m.runOperation('alpha', () => 'b got alpha', { context: b });
    await sleep(2);
    // ... and only then takes beta, in another branch.
    const holdingB = m.runOperation('beta', () => holdB.opened, { context: b });
    await sleep(2);
    const aWaits = m.runOperation('beta', () => 'a got beta', { context: a });
    setTimeout(() => {
      holdA.open();
      holdB.open();
    }, 20);
    await expect(aWaits).resolves.toBe('a got beta');
    await expect(bWaits).resolves.toBe('b got alpha');
    await Promise.all([holdingA, holdingB]);
  });
});

describe('FIFO across managers in Redis mode', () => {
  let redis;
  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await redis?.dispose();
  });

  it('serves requests from several managers on one id in request order', async () => {
    const adapters = Array.from({ length: 8 }, () => new RedisAdapter({ url: redis.url }));
    const managers = adapters.map((adapter) => new MutexManager({ adapter }));
    const order = [];
    const first = gate();
    const holder = managers[0].runOperation('shared', () => first.opened);
    await sleep(20);
    const requests = [];
    const queued = () => Number(redis.cli('LLEN', 'uniquemutex:shared:locco-q'));
    for (let i = 1; i < 8; i++) {
      requests.push(managers[i].runOperation('shared', () => order.push(i)));
      // Each request has its place in the server's queue before the next one is made.
      await until(() => queued() === i);
    }
    first.open();
    await holder;
    await Promise.all(requests);
    expect(order).toEqual([1, 2, 3, 4, 5, 6, 7]);
    await Promise.all(adapters.map((a) => a.close()));
  });

  it('keeps request order when each manager has several requests pending', async () => {
    // The report's shape: request i comes from manager i % 4, so every manager has many
    // requests waiting at once.
    const adapters = Array.from({ length: 4 }, () => new RedisAdapter({ url: redis.url }));
    const managers = adapters.map((adapter) => new MutexManager({ adapter }));
    const order = [];
    const first = gate();
    const holder = managers[0].runOperation('many', () => first.opened);
    await sleep(20);
    const requests = [];
    const queued = () => Number(redis.cli('LLEN', 'uniquemutex:many:locco-q'));
    for (let i = 1; i < 24; i++) {
      requests.push(managers[i % 4].runOperation('many', () => order.push(i)));
      await until(() => queued() === i);
    }
    first.open();
    await holder;
    await Promise.all(requests);
    expect(order).toEqual(Array.from({ length: 23 }, (_, i) => i + 1));
    await Promise.all(adapters.map((a) => a.close()));
  });

  it('gives a nested request (its chain holds another mutex) its place in the same queue', async () => {
    const adapters = Array.from({ length: 3 }, () => new RedisAdapter({ url: redis.url }));
    const [a, b, c] = adapters.map((adapter) => new MutexManager({ adapter }));
    const order = [];
    const first = gate();
    const holder = a.runOperation('nested', () => first.opened);
    await sleep(20);
    const queued = () => Number(redis.cli('LLEN', 'uniquemutex:nested:locco-q'));
    const nested = b.runOperation('outer', () => b.runOperation('nested', () => order.push('nested')));
    await until(() => queued() === 1);
    const plain = c.runOperation('nested', () => order.push('plain'));
    await until(() => queued() === 2);
    first.open();
    await Promise.all([holder, nested, plain]);
    expect(order).toEqual(['nested', 'plain']);
    await Promise.all(adapters.map((x) => x.close()));
  });
});

describe('redis: { urls } with several independent servers', () => {
  let servers = [];
  beforeAll(async () => {
    servers = await Promise.all([startRedis(), startRedis(), startRedis()]);
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.dispose()));
  });

  it('means a quorum (Redlock): the lock is taken on every server', async () => {
    const m = new MutexManager({ redis: { urls: servers.map((s) => s.url) } });
    const holders = await m.runOperation('quorum', () => servers.map((s) => s.cli('EXISTS', 'uniquemutex:quorum')));
    expect(holders).toEqual(['1', '1', '1']);
    // A release answers once a majority let go; the last server hears of it a moment later.
    const gone = () => servers.filter((s) => s.cli('EXISTS', 'uniquemutex:quorum') === '0').length;
    expect(gone()).toBeGreaterThanOrEqual(2);
    await until(() => gone() === 3);
    await m.dispose();
  });
});
