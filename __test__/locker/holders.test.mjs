// Counting semaphores and read-write locks on every built-in backend, each against a server
// this file starts: room is counted, every holder's lease is its own, a waiting writer keeps
// new readers out, and a holder that dies (SIGKILL, or never released) frees its place when
// its own lease ends, not before.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { Locker, LockHeldError, ValidationError } from 'locco-rs';
import { HOLDER_BACKENDS, adapterFor } from '../support/holder-backends.mjs';
import { sleep } from '../support/adapters.mjs';
import { MapAdapter } from '../support/map-adapter.mjs';

const CHILD = fileURLToPath(new URL('../support/holder-child.mjs', import.meta.url));
const node = process.execPath;
/** Waiting acquisitions: poll often, and give up well after any lease here ends. */
const PATIENT = { retries: 1000, delay: 25 };
let keys = 0;

/** Starts a process that takes a holder of `key` and keeps it until killed. */
async function crashingHolder(spec, method, key, options) {
  const { shared, ...plain } = spec;
  const child = spawn(node, [CHILD, JSON.stringify({ spec: plain, method, key, options })], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  const deadline = Date.now() + 15_000;
  while (!out.includes('held')) {
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`the holder process did not take ${key} (exit ${child.exitCode})`);
    await sleep(20);
  }
  return {
    async kill() {
      child.kill('SIGKILL');
      await once(child, 'exit').catch(() => {});
    },
  };
}

for (const backend of HOLDER_BACKENDS) {
  describe(`semaphores and read-write locks: ${backend.name}`, () => {
    let server;
    let adapters = [];
    let fencing = false;
    const locker = (options = {}) => {
      const adapter = adapterFor(server.spec);
      if (adapter !== server.spec.shared) adapters.push(adapter);
      return new Locker({ adapter, ...options });
    };
    const key = () => `h${++keys}:${process.pid}`;

    before(async () => {
      server = await backend.start();
      try {
        locker({ fencing: true });
        fencing = true;
      } catch (e) {
        if (!(e instanceof ValidationError)) throw e;
      }
    });
    after(async () => {
      await Promise.all(adapters.map((a) => a.close?.()));
      await server?.dispose();
    });

    it('a semaphore admits `limit` holders, each with its own lease; a release lets a waiter in', async () => {
      const k = key();
      const [a, b, c] = [locker(), locker(), locker()];
      const permits = await Promise.all([a, b, c].map((l) => l.acquirePermit(k, { limit: 3, ttl: 10_000 })));
      assert.deepEqual(permits.map((p) => p.key).sort(), [0, 1, 2].map((i) => `${k}:permit:${i}`));
      assert.equal(await a.tryAcquirePermit(k, { limit: 3, ttl: 10_000 }), null);
      await assert.rejects(a.acquirePermit(k, { limit: 3, ttl: 10_000, retry: { retries: 1, delay: 20 } }), LockHeldError);
      const waiting = b.acquirePermit(k, { limit: 3, ttl: 10_000, retry: PATIENT });
      await sleep(100);
      assert.equal(await permits[1].release(), true);
      const got = await waiting;
      assert.equal(got.key, permits[1].key);
      assert.equal(got.state, 'held');
      // Each lease is its own: extending one leaves the others as they were.
      await got.extend(20_000);
      assert.equal(await permits[0].isHeld(), true);
      await Promise.all([permits[0], permits[2], got].map((p) => p.release()));
      assert.notEqual(await c.tryAcquirePermit(k, { limit: 3, ttl: 1000 }), null);
    });

    if (backend.fair) {
      it('waiters for a permit are served first come, first served', async () => {
        const k = key();
        const holder = await locker().acquirePermit(k, { limit: 1, ttl: 10_000 });
        const order = [];
        const waiters = [];
        for (let i = 0; i < 4; i++) {
          // Each has tried, and so joined the line, before the next comes: a wait for its first
          // 'contended' event, not a fixed pause that a slow connection outlasts.
          let joined;
          const tried = new Promise((resolve) => (joined = resolve));
          const l = locker({ onEvent: (e) => e.type === 'contended' && joined() });
          waiters.push(
            l.acquirePermit(k, { limit: 1, ttl: 10_000, retry: { retries: 1000, delay: 20 } }).then(async (p) => {
              order.push(i);
              await sleep(50);
              await p.release();
            }),
          );
          await tried;
          await sleep(50);
        }
        await holder.release();
        await Promise.all(waiters);
        assert.deepEqual(order, [0, 1, 2, 3]);
      });
    }

    it('a permit never released frees when its lease ends, not before', async () => {
      const k = key();
      const ttl = 800;
      const l = locker();
      const started = Date.now();
      await l.acquirePermit(k, { limit: 1, ttl }); // dropped, never released
      const got = await locker().acquirePermit(k, { limit: 1, ttl: 5_000, retry: PATIENT });
      assert.ok(Date.now() - started >= ttl * 0.9, `a permit came ${Date.now() - started} ms after a ${ttl} ms lease began`);
      assert.equal(await got.isHeld(), true);
      await got.release();
    });

    it('readers share; a writer is alone; writers are preferred over new readers', async () => {
      const k = key();
      const [a, b, w] = [locker({ fencing }), locker({ fencing }), locker({ fencing })];
      const r1 = await a.acquireRead(k, { ttl: 10_000 });
      const r2 = await b.acquireRead(k, { ttl: 10_000 });
      assert.notEqual(r1.key, r2.key);
      assert.equal(await w.tryAcquireWrite(k, { ttl: 10_000 }), null);
      const writer = w.acquireWrite(k, { ttl: 10_000, retry: PATIENT });
      await sleep(300);
      assert.equal(await a.tryAcquireRead(k, { ttl: 10_000 }), null, 'a new reader got in past a waiting writer');
      await r1.release();
      await sleep(100);
      let settled = false;
      writer.then(() => (settled = true));
      await sleep(50);
      assert.equal(settled, false, 'the writer got in beside a reader');
      await r2.release();
      const wl = await writer;
      assert.equal(wl.key, `${k}:write`);
      assert.equal(await a.tryAcquireRead(k, { ttl: 10_000 }), null, 'a reader beside the writer');
      assert.equal(await b.tryAcquireWrite(k, { ttl: 10_000 }), null, 'a second writer');
      if (fencing) {
        assert.equal(typeof wl.fence, 'number');
        await wl.release();
        const next = await b.acquireWrite(k, { ttl: 10_000, retry: PATIENT });
        assert.ok(next.fence > wl.fence, `writer fences grow: ${wl.fence} then ${next.fence}`);
        await next.release();
      } else {
        await wl.release();
      }
      const again = await a.tryAcquireRead(k, { ttl: 10_000 });
      assert.notEqual(again, null, 'readers get in once the writer left');
      await again.release();
    });

    it('a reader never released holds a writer only until its own lease ends', async () => {
      const k = key();
      const ttl = 800;
      const started = Date.now();
      await locker().acquireRead(k, { ttl }); // dropped, never released
      const live = await locker().acquireRead(k, { ttl: 60_000 });
      await live.release();
      const wl = await locker().acquireWrite(k, { ttl: 5_000, retry: PATIENT });
      assert.ok(Date.now() - started >= ttl * 0.9, `the writer got in ${Date.now() - started} ms after a ${ttl} ms read lease began`);
      assert.equal(await wl.isHeld(), true);
      await wl.release();
    });

    // In process only: over a network on a busy machine, a 50 ms lease is too short for the
    // backend's answers themselves (a timeout, not this rule).
    it('a permit or write waiter with a ttl below 100 ms keeps its place until there is room', { skip: !backend.inProcess }, async () => {
      const k = key();
      const [a, b] = [locker(), locker()];
      const permit = await a.acquirePermit(k, { limit: 1, ttl: 60_000 });
      const reader = await a.acquireRead(k, { ttl: 60_000, maxReaders: 4 });
      const retry = { retries: 100_000, delay: 10, timeout: 15_000 };
      const outcomes = Promise.allSettled([
        b.acquirePermit(k, { limit: 1, ttl: 50, retry }),
        b.acquireWrite(k, { ttl: 50, maxReaders: 4, retry }),
      ]);
      // Several of the waiters' leases long: each had to keep its turn or its write key.
      await sleep(500);
      await Promise.all([permit.release(), reader.release()]);
      const [p, w] = await outcomes;
      assert.equal(p.status, 'fulfilled', `the permit waiter failed: ${p.reason}`);
      assert.equal(w.status, 'fulfilled', `the writer failed: ${w.reason}`);
      assert.equal(p.value.key, `${k}:permit:0`);
      assert.equal(w.value.key, `${k}:write`);
      await Promise.all([p.value.release(), w.value.release()]);
    });

    it('a full semaphore or a taken read-write lock says what it is in its error, not "held elsewhere"', async () => {
      const k = key();
      const l = locker();
      const permits = [await l.acquirePermit(k, { limit: 2, ttl: 10_000 }), await l.acquirePermit(k, { limit: 2, ttl: 10_000 })];
      const once = { retries: 0 };
      // This Locker holds both permits: "elsewhere" would send the reader after someone else.
      await assert.rejects(l.acquirePermit(k, { limit: 2, ttl: 10_000, retry: once }), (e) => {
        assert.ok(e instanceof LockHeldError, e);
        assert.match(e.message, new RegExp(`^all 2 permits of semaphore "${k}" are held: gave up after 1 attempt`));
        assert.equal(e.key, k);
        return true;
      });
      await Promise.all(permits.map((p) => p.release()));
      const w = await l.acquireWrite(k, { ttl: 10_000 });
      await assert.rejects(l.acquireRead(k, { ttl: 10_000, retry: once }), (e) => {
        assert.match(e.message, new RegExp(`^read-write lock "${k}" has a writer, or all \\d+ readers it admits: gave up after`));
        return true;
      });
      await assert.rejects(l.acquireWrite(k, { ttl: 10_000, retry: once }), (e) => {
        assert.match(e.message, new RegExp(`^read-write lock "${k}" has readers or a writer: gave up after`));
        return true;
      });
      await w.release();
    });

    // Built on inspect, which the JavaScript MapAdapter does not have.
    it('inspectPermits and inspectReadWrite show who holds a semaphore and a read-write lock', { skip: backend.name === 'JavaScript MapAdapter' }, async () => {
      const k = key();
      const l = locker();
      const permits = [await l.acquirePermit(k, { limit: 3, ttl: 10_000, holder: 'worker-a' }), await l.acquirePermit(k, { limit: 3, ttl: 10_000, holder: 'worker-b' })];
      const seen = await l.inspectPermits(k, { limit: 3 });
      assert.equal(seen.limit, 3);
      assert.equal(seen.held, 2);
      assert.deepEqual(seen.holders.map((h) => h.key).sort(), permits.map((p) => p.key).sort());
      assert.deepEqual(seen.holders.map((h) => h.holder).sort(), ['worker-a', 'worker-b']);
      // (Redlock's servers keep the ttl plus its clock-drift allowance.)
      for (const h of seen.holders) assert.ok(h.held && (h.ttlLeft === undefined || (h.ttlLeft > 0 && h.ttlLeft <= 10_200)), JSON.stringify(h));
      await Promise.all(permits.map((p) => p.release()));
      assert.deepEqual(await l.inspectPermits(k, { limit: 3 }), { limit: 3, held: 0, holders: [] });
      await assert.rejects(l.inspectPermits(k, {}), (e) => e instanceof ValidationError && e.field === 'limit');

      const reads = [await l.acquireRead(k, { ttl: 10_000, maxReaders: 4 }), await l.acquireRead(k, { ttl: 10_000, maxReaders: 4 })];
      let rw = await l.inspectReadWrite(k, { maxReaders: 4 });
      assert.equal(rw.writer, null);
      assert.deepEqual(rw.readers.map((r) => r.key).sort(), reads.map((r) => r.key).sort());
      await Promise.all(reads.map((r) => r.release()));
      const w = await l.acquireWrite(k, { ttl: 10_000, maxReaders: 4, holder: 'the-writer' });
      rw = await l.inspectReadWrite(k, { maxReaders: 4 });
      assert.equal(rw.writer?.key, `${k}:write`);
      assert.deepEqual(rw.readers, []);
      await w.release();
      assert.equal((await l.inspectReadWrite(k, { maxReaders: 4 })).writer, null);
    });

    it('bad counts are refused with the field named', async () => {
      const l = locker();
      await assert.rejects(l.acquirePermit('x', { ttl: 1000 }), (e) => e instanceof ValidationError && e.field === 'limit');
      await assert.rejects(l.tryAcquirePermit('x', { ttl: 1000, limit: 0 }), (e) => e instanceof ValidationError && e.field === 'limit');
      await assert.rejects(l.acquireRead('x', { ttl: 1000, maxReaders: 2.5 }), (e) => e instanceof ValidationError && e.field === 'maxReaders');
      await assert.rejects(l.acquireWrite('x', { ttl: 1000, limit: 2 }), ValidationError);
      await assert.rejects(l.tryAcquireRead('x', { ttl: 1000, retry: { retries: 1 } }), ValidationError);
    });

    if (!backend.inProcess) {
      it('a holder process killed with SIGKILL frees its permit and its read when their leases end', async () => {
        const k = key();
        const ttl = 1500;
        const permit = await crashingHolder(server.spec, 'acquirePermit', k, { limit: 1, ttl });
        const reader = await crashingHolder(server.spec, 'acquireRead', k, { ttl });
        // Alive and auto-extended: still held well past one ttl.
        await sleep(ttl + 300);
        const l = locker();
        assert.equal(await l.tryAcquirePermit(k, { limit: 1, ttl: 1000 }), null, 'the live holder lost its permit');
        assert.equal(await l.tryAcquireWrite(k, { ttl: 1000 }), null, 'the live reader lost its read');
        const killedAt = Date.now();
        await Promise.all([permit.kill(), reader.kill()]);
        const [p, w] = await Promise.all([
          l.acquirePermit(k, { limit: 1, ttl: 5_000, retry: PATIENT }),
          locker().acquireWrite(k, { ttl: 5_000, retry: PATIENT }),
        ]);
        const waited = Date.now() - killedAt;
        // The last extension may have gone out just before the kill: at most a full lease.
        const lease = Math.max(ttl, backend.crashLease ?? 0);
        assert.ok(waited <= lease + 2000, `freed only ${waited} ms after the kill (lease ${lease} ms)`);
        assert.equal(p.state, 'held');
        assert.equal(w.state, 'held');
        await Promise.all([p.release(), w.release()]);
      });
    }
  });
}

describe('a writer whose renewal fails once the readers left', () => {
  it('acquireWrite rejects with the failure and gives the write key back', async () => {
    const adapter = new MapAdapter();
    const locker = new Locker({ adapter });
    const reader = await locker.acquireRead('wf', { ttl: 60_000, maxReaders: 4 });
    const writing = locker.acquireWrite('wf', { ttl: 60_000, maxReaders: 4, retry: PATIENT });
    const outcome = writing.then(
      (lock) => ({ lock }),
      (error) => ({ error }),
    );
    await sleep(300); // it waited, so it renews its lease once alone: that renewal fails
    const failure = new Error('connection reset');
    adapter.extend = async () => {
      throw failure;
    };
    await reader.release();
    const { error } = await outcome;
    assert.equal(error, failure);
    const next = await locker.tryAcquireRead('wf', { ttl: 1000, maxReaders: 4 });
    assert.ok(next, 'the write key was left held for the whole ttl');
    await next.release();
  });
});
