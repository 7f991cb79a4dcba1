// Safety and lifecycle of the binding: keys read exactly, locks that outlive their objects,
// aborts racing grants, process exit, worker termination, loading the facade twice, and
// native objects freed once their JavaScript owners are gone.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, it } from 'node:test';
import { Locker, LockStateError, ValidationError } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { ADAPTERS, sleep, until } from '../support/adapters.mjs';
import { MapAdapter } from '../support/map-adapter.mjs';
import { startMongo, startPostgres, startRedis } from '../support/servers.mjs';

const ROOT = new URL('../..', import.meta.url);

/** Runs `script` (CommonJS) in a fresh Node process; answers { status, signal, stdout, stderr }. */
function runNode(script, { args = [], timeout = 60_000, env = {} } = {}) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [...args, '-e', script], {
      cwd: ROOT,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeout);
    child.on('close', (status, signal) => {
      clearTimeout(timer);
      resolve({ status, signal, stdout, stderr });
    });
  });
}

describe('keys are read exactly', () => {
  for (const [name, make] of ADAPTERS) {
    describe(name, () => {
      it('two long keys that differ only in their last character are two locks', async () => {
        const locker = new Locker({ adapter: make(), retry: { retries: 0 } });
        const a = await locker.acquire('é'.repeat(200) + 'a', { ttl: 10_000 });
        const b = await locker.tryAcquire('é'.repeat(200) + 'b', { ttl: 10_000 });
        assert.ok(b, 'the second key is free');
        assert.equal(a.key, 'é'.repeat(200) + 'a');
        await a.release();
        await b.release();
      });

      // A short key is read in one call into a buffer of 256 units; one that fills it is read
      // again whole, a surrogate pair cut at the buffer's end included.
      it('keys around the read buffer (255 to 257 units, a pair across its end) are read whole', async () => {
        const locker = new Locker({ adapter: make(), retry: { retries: 0 } });
        for (const stem of ['k'.repeat(254), 'k'.repeat(255), 'k'.repeat(256), 'k'.repeat(255) + '😀']) {
          const a = await locker.acquire(`${stem}a`, { ttl: 10_000 });
          const b = await locker.tryAcquire(`${stem}b`, { ttl: 10_000 });
          assert.ok(b, `the second key of ${stem.length + 1} units is free`);
          assert.equal(a.key, `${stem}a`);
          assert.equal(b.key, `${stem}b`);
          assert.equal(await locker.tryAcquire(`${stem}a`, { ttl: 10_000 }), null, 'the first key is held');
          await a.release();
          await b.release();
        }
      });

      it('the same on the full path (with a signal) and in acquireMany', async () => {
        const locker = new Locker({ adapter: make(), retry: { retries: 0 } });
        const signal = new AbortController().signal;
        const a = await locker.acquire('ü'.repeat(300) + 'x', { ttl: 10_000, signal });
        const set = await locker.acquireMany(['ü'.repeat(300) + 'y', 'ü'.repeat(300) + 'z'], { ttl: 10_000 });
        assert.equal(set.locks.length, 2);
        await a.release();
        await set.release();
      });

      it('refuses a key over 4 KiB of UTF-8, counted exactly', async () => {
        const locker = new Locker({ adapter: make() });
        // 2,049 two-byte characters: 4,098 bytes.
        await assert.rejects(locker.acquire('é'.repeat(2049), { ttl: 1000 }), (e) => {
          assert.ok(e instanceof ValidationError, String(e));
          assert.equal(e.field, 'key');
          return true;
        });
        await assert.rejects(locker.tryAcquire('é'.repeat(2049), { ttl: 1000 }), ValidationError);
        const ok = await locker.acquire('é'.repeat(2048), { ttl: 1000 });
        await ok.release();
      });

      it('refuses a key that is not well-formed UTF-16, or that holds NUL', async () => {
        const locker = new Locker({ adapter: make() });
        for (const key of ['k:\ud800', 'k:\udfff', '\udc00k', 'a\u0000b']) {
          for (const call of [
            () => locker.acquire(key, { ttl: 1000 }),
            () => locker.tryAcquire(key, { ttl: 1000 }),
            () => locker.acquire(key, { ttl: 1000, retry: { retries: 0 } }),
            () => locker.acquireMany([key], { ttl: 1000 }),
          ]) {
            await assert.rejects(call(), (e) => {
              assert.ok(e instanceof ValidationError, `${JSON.stringify(key)}: ${e}`);
              assert.equal(e.field, 'key');
              return true;
            });
          }
        }
        // A well-formed surrogate pair is fine.
        const lock = await locker.acquire('k:\ud83d\ude00', { ttl: 1000 });
        assert.equal(lock.key, 'k:\ud83d\ude00');
        await lock.release();
      });
    });
  }

  it('a key prefix is checked the same way', () => {
    assert.throws(() => new Locker({ adapter: new InMemoryAdapter(), keyPrefix: 'p:\ud800' }), (e) => {
      assert.ok(e instanceof ValidationError);
      assert.equal(e.field, 'keyPrefix');
      return true;
    });
  });
});

describe('aborts and grants', () => {
  for (const [name, make] of ADAPTERS) {
    it(`${name}: an abort right after acquire leaves the key free`, async () => {
      const adapter = make();
      const locker = new Locker({ adapter });
      const ac = new AbortController();
      const p = locker.acquire('race', { ttl: 60_000, signal: ac.signal, autoExtend: { maxHold: 3_600_000 } });
      ac.abort();
      await assert.rejects(p, (e) => e === ac.signal.reason);
      // The grant, if it landed, is given back: another Locker gets the key soon.
      const other = new Locker({ adapter, retry: { retries: 50, delay: 20 } });
      const lock = await other.acquire('race', { ttl: 1000 });
      assert.equal(lock.state, 'held');
      await lock.release();
    });
  }
});

describe('a lock whose object is collected', () => {
  it('keeps its heartbeat until released, lost or maxHold', async () => {
    const script = `
      const { Locker } = require('locco-rs');
      const { InMemoryAdapter } = require('locco-rs/memory');
      const adapter = new InMemoryAdapter();
      const events = [];
      const locker = new Locker({ adapter, onEvent: (e) => events.push(e.type) });
      const rival = new Locker({ adapter, retry: { retries: 0 } });
      (async () => {
        await locker.acquire('leader', { ttl: 500, autoExtend: { maxHold: 3_600_000 } });
        for (let i = 0; i < 5; i++) { globalThis.gc(); await new Promise((r) => setTimeout(r, 50)); }
        const until = Date.now() + 1500;
        let stolen = false;
        while (Date.now() < until) {
          globalThis.gc();
          const l = await rival.tryAcquire('leader', { ttl: 500 });
          if (l) { stolen = true; await l.release(); break; }
          await new Promise((r) => setTimeout(r, 50));
        }
        console.log(JSON.stringify({ stolen, lost: events.includes('lost'), extended: events.filter((t) => t === 'extended').length }));
        process.exit(0);
      })();
    `;
    const r = await runNode(script, { args: ['--expose-gc'] });
    assert.equal(r.status, 0, r.stderr);
    const out = JSON.parse(r.stdout.trim());
    assert.equal(out.stolen, false, 'nobody else got the key while the heartbeat ran');
    assert.ok(out.extended >= 3, `the heartbeat went on (${out.extended} extensions)`);
  });
});

describe('NODE_DEBUG=locco-rs', () => {
  const script = `
    const { Locker } = require('locco-rs');
    const { InMemoryAdapter } = require('locco-rs/memory');
    (async () => {
      const adapter = new InMemoryAdapter();
      const first = new Locker({ adapter });
      const second = new Locker({ adapter, retry: { retries: 100, delay: 10 } });
      const lock = await first.acquire('job:7', { ttl: 300, autoExtend: { interval: 50, maxHold: 5000 } });
      const waiting = second.acquire('job:7', { ttl: 1000 });
      await new Promise((r) => setTimeout(r, 200));
      await lock.release();
      await (await waiting).release();
      const late = await first.acquire('job:8', { ttl: 20 });
      await new Promise((r) => setTimeout(r, 100));
      console.log(late.state);
    })();
  `;

  it('logs one line per event of every Locker, with the key and timings', async () => {
    const r = await runNode(script, { env: { NODE_DEBUG: 'locco-rs' } });
    assert.equal(r.status, 0, r.stderr);
    const lines = r.stderr.split('\n').filter((l) => l.startsWith('LOCCO-RS '));
    const kinds = new Set(lines.map((l) => l.split(' ')[2]));
    for (const k of ['acquired', 'contended', 'extended', 'released']) assert.ok(kinds.has(k), `no ${k} line in:\n${r.stderr}`);
    assert.ok(lines.some((l) => /acquired "job:7" ttl 1000 ms, waited \d+\.\d ms, \d+ attempt\(s\)/.test(l)), r.stderr);
    assert.ok(lines.some((l) => /contended "job:7" ttl 1000 ms, attempt \d+, .* \(held\)/.test(l)), r.stderr);
    // A lease that runs out unrenewed is a loss (reported once somebody listens: here the log).
    assert.ok(lines.some((l) => /lost "job:8" ttl 20 ms, held .* \(expired\)/.test(l)), r.stderr);
  });

  it('logs nothing without it', async () => {
    const r = await runNode(script, { env: { NODE_DEBUG: '' } });
    assert.equal(r.status, 0, r.stderr);
    assert.doesNotMatch(r.stderr, /LOCCO-RS/);
  });
});

describe('the process', () => {
  const servers = {};
  before(async () => {
    [servers.redis, servers.postgres, servers.mongo] = await Promise.all([startRedis(), startPostgres(), startMongo()]);
  });
  after(() => Promise.all(Object.values(servers).map((s) => s.dispose())));

  // Each backend: how a child makes its adapter, and how many acquires it leaves in flight.
  const BACKENDS = {
    redis: { module: 'redis', make: (url) => `new RedisAdapter({ url: ${JSON.stringify(url)} })`, name: 'RedisAdapter', n: 2000, runs: 10 },
    postgres: { module: 'postgres', make: (url) => `new PostgresAdapter({ url: ${JSON.stringify(url)}, tableName: 'exit_' + process.pid })`, name: 'PostgresAdapter', n: 500, runs: 4 },
    mongo: { module: 'mongo', make: (url) => `new MongoAdapter({ url: ${JSON.stringify(url)}, dbName: 'exit' })`, name: 'MongoAdapter', n: 500, runs: 4 },
  };
  const inFlight = (b, url) => `
    const { Locker } = require('locco-rs');
    const { ${b.name} } = require('locco-rs/${b.module}');
    const locker = new Locker({ adapter: ${b.make(url)} });
    async function run() {
      await locker.tryAcquire('warm:' + process.pid, { ttl: 5000 });
      for (let i = 0; i < ${b.n}; i++) locker.acquire('k:' + process.pid + ':' + i, { ttl: 5000, autoExtend: { maxHold: 60000 } }).catch(() => {});
    }
  `;

  for (const [kind, b] of Object.entries(BACKENDS)) {
    it(`${kind}: exits cleanly with ${b.n} acquires in flight (${b.runs} runs)`, async () => {
      const script = `${inFlight(b, servers[kind].url)}; run().then(() => process.exit(0));`;
      for (let i = 0; i < b.runs; i++) {
        const r = await runNode(script);
        assert.equal(r.signal, null, `run ${i}: killed by ${r.signal}: ${r.stderr}`);
        assert.equal(r.status, 0, `run ${i}: ${r.stderr}`);
      }
    });

    it(`${kind}: survives worker.terminate() of workers with acquires in flight (${b.runs} runs)`, async () => {
      const worker = `${inFlight(b, servers[kind].url)}; run().then(() => require('node:worker_threads').parentPort.postMessage('busy'));`;
      const script = `
        const { Worker } = require('node:worker_threads');
        (async () => {
          for (let i = 0; i < ${b.runs}; i++) {
            const w = new Worker(${JSON.stringify(worker)}, { eval: true });
            await new Promise((resolve, reject) => { w.once('message', resolve); w.once('error', reject); });
            await w.terminate();
          }
          console.log('alive');
        })().catch((e) => { console.error(e); process.exit(1); });
      `;
      const r = await runNode(script, { timeout: 120_000 });
      assert.equal(r.signal, null, `killed by ${r.signal}: ${r.stderr}`);
      assert.equal(r.status, 0, r.stderr);
      assert.equal(r.stdout.trim(), 'alive');
    });
  }

  it('loading the facade twice (a cleared require cache) works and exits cleanly', async () => {
    const script = `
      const path = require.resolve('locco-rs');
      const first = require('locco-rs');
      const { InMemoryAdapter: FirstMemory } = require('locco-rs/memory');
      const firstLocker = new first.Locker({ adapter: new FirstMemory() });
      (async () => {
        const held = await firstLocker.acquire('a', { ttl: 10_000 });
        for (const k of Object.keys(require.cache)) delete require.cache[k];
        const second = require('locco-rs');
        const { InMemoryAdapter } = require('locco-rs/memory');
        const locker = new second.Locker({ adapter: new InMemoryAdapter() });
        const lock = await locker.acquire('b', { ttl: 10_000, retry: { retries: 1 } });
        const released = await lock.release();
        // The first facade's objects still work.
        const releasedFirst = await held.release();
        const again = await firstLocker.acquire('a', { ttl: 10_000, retry: { retries: 0 } });
        await again.release();
        console.log(JSON.stringify({ released, releasedFirst }));
      })().catch((e) => { console.error(e); process.exit(1); });
    `;
    const r = await runNode(script);
    assert.equal(r.signal, null, `killed by ${r.signal}: ${r.stderr}`);
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout.trim()), { released: true, releasedFirst: true });
  });
});

describe('operations in flight', () => {
  it('leave no garbage that young-generation collections must keep', async () => {
    // Each awaited operation has an entry in a table of the facade's. A Map there, under steady
    // adding and deleting, links each table it outgrows to the next; once one has reached the
    // old generation, every later operation's promise survived the young collections (10 MB
    // per 10,000 pairs here, and 25-50 ms pauses under Redis W2) until a full collection.
    const script = `
      const { Locker } = require('locco-rs');
      const v8 = require('node:v8');
      // A plain-object adapter: a Map here would keep garbage of its own the same way.
      const held = Object.create(null);
      const adapter = {
        async acquire({ key, token }) { if (held[key] !== undefined) return false; held[key] = token; return true; },
        async release({ key, token }) { if (held[key] !== token) return false; delete held[key]; return true; },
        async extend({ key, token }) { return held[key] === token; },
        async isHeld({ key, token }) { return held[key] === token; },
      };
      const used = () => v8.getHeapStatistics().used_heap_size;
      const tick = () => new Promise((r) => setImmediate(r));
      (async () => {
        const locker = new Locker({ adapter, retry: { retries: 0 } });
        const pairs = async (n) => {
          let next = 0;
          await Promise.all(Array.from({ length: 64 }, async (_, w) => {
            while (next++ < n) { const l = await locker.acquire('k' + w, { ttl: 10000 }); await l.release(); }
          }));
        };
        await pairs(2000);
        const kept = [];
        for (let round = 0; round < 4; round++) {
          // A full collection first moves the facade's tables to the old generation.
          gc(); await tick(); gc();
          const base = used();
          await pairs(10000);
          gc({ type: 'minor' }); gc({ type: 'minor' });
          kept.push((used() - base) / 1e6);
        }
        console.log(JSON.stringify(kept));
      })();
    `;
    const r = await runNode(script, { args: ['--expose-gc'], timeout: 120_000 });
    assert.equal(r.status, 0, r.stderr);
    const kept = JSON.parse(r.stdout.trim());
    // About 0.8 MB is live or young here; the chained tables kept 10 MB.
    for (const mb of kept) assert.ok(mb < 4, `young collections kept ${mb.toFixed(1)} MB after 10,000 pairs (${kept.map((m) => m.toFixed(1))})`);
  });
});

describe('native objects are freed', () => {
  it('200k short-lived Lockers do not grow memory without bound', async () => {
    const script = `
      const { Locker } = require('locco-rs');
      const { InMemoryAdapter } = require('locco-rs/memory');
      (async () => {
        const round = async () => {
          for (let i = 0; i < 20000; i++) {
            const locker = new Locker({ adapter: new InMemoryAdapter({ now: () => performance.now() }), onEvent: () => {}, retry: { delay: () => 1 } });
            const lock = await locker.acquire('k', { ttl: 1000 });
            await lock.release();
          }
          globalThis.gc();
          await new Promise((r) => setTimeout(r, 20));
          globalThis.gc();
        };
        // The allocator and the collector settle over the first rounds; a leak keeps growing.
        for (let i = 0; i < 6; i++) await round();
        const base = process.memoryUsage().rss;
        for (let i = 0; i < 6; i++) await round();
        const grown = process.memoryUsage().rss - base;
        const native = require('./binding.js');
        const n = require('./lib/native.js');
        const facade = [n.lockers.size, n.adapters.size, n.delays.size];
        console.log(JSON.stringify({ grownMb: Math.round(grown / 1e6), registry: native.registrySizesForTest(), facade }));
      })();
    `;
    const r = await runNode(script, { args: ['--expose-gc'], timeout: 120_000 });
    assert.equal(r.status, 0, r.stderr);
    const { grownMb, registry, facade } = JSON.parse(r.stdout.trim());
    // What is still alive after the collections: a few Lockers of the last round at most,
    // never one per Locker made (200k).
    for (const [i, n] of [...registry, ...facade].entries()) assert.ok(n < 2000, `kind ${i}: ${n} kept (${registry} / ${facade})`);
    // 120k Lockers after the baseline; leaking an adapter, a Locker and their functions each
    // grew RSS by about 350 MB here.
    // RSS is noisy (allocator and collector high-water marks), so its bound is loose.
    assert.ok(grownMb < 100, `RSS grew ${grownMb} MB over 120k Lockers`);
  });

  it('Locker.close() releases what it holds, stops heartbeats, and refuses new work', async () => {
    const adapter = new InMemoryAdapter();
    const events = [];
    const locker = new Locker({ adapter, onEvent: (e) => events.push(e.type) });
    const a = await locker.acquire('c1', { ttl: 1000, autoExtend: { maxHold: 60_000 } });
    const b = await locker.acquire('c2', { ttl: 1000 });
    await locker.close();
    assert.equal(a.state, 'released');
    assert.equal(b.state, 'released');
    const other = new Locker({ adapter, retry: { retries: 0 } });
    const again = await other.tryAcquire('c1', { ttl: 1000 });
    assert.ok(again, 'the key was released');
    await again.release();
    await assert.rejects(locker.acquire('c3', { ttl: 1000 }), (e) => e.code === 'LOCK_STATE');
    await locker.close(); // twice is fine
    const extendedBefore = events.filter((t) => t === 'extended').length;
    await sleep(800);
    assert.equal(events.filter((t) => t === 'extended').length, extendedBefore, 'no heartbeat after close');
  });

  it('Locker.close({ release: false }) stops the heartbeats and leaves each lease to run out', async () => {
    const adapter = new InMemoryAdapter();
    const events = [];
    const locker = new Locker({ adapter, onEvent: (e) => events.push(e.type) });
    const claim = await locker.acquire('c10', { ttl: 400, autoExtend: { interval: 100, maxHold: 60_000 } });
    await until(() => events.includes('extended'), 5000);
    await locker.close({ release: false });
    await assert.rejects(locker.acquire('c11', { ttl: 1000 }), (e) => e.code === 'LOCK_STATE');
    // The claim stays on the backend: nobody else gets the key before its lease ends.
    const other = new Locker({ adapter, retry: { retries: 0 } });
    assert.equal(await other.tryAcquire('c10', { ttl: 1000 }), null, 'the claim was released by close');
    assert.equal(claim.state, 'held');
    const extended = events.filter((e) => e === 'extended').length;
    // Then it runs out (no heartbeat renews it) and the key is free.
    await until(() => claim.state === 'lost', 10_000);
    assert.equal(claim.lostReason, 'expired');
    assert.equal(events.filter((e) => e === 'extended').length, extended, 'a heartbeat ran after close');
    // The local lease ends a little before the backend's (the clock-drift margin).
    let next = null;
    for (const start = Date.now(); next === null && Date.now() - start < 5000; await sleep(20)) {
      next = await other.tryAcquire('c10', { ttl: 1000 });
    }
    assert.ok(next, 'the key is still held 5 s after the lease ran out');
    await next.release();
    await other.close();
  });

  it('Locker.close() checks its options', async () => {
    const locker = new Locker({ adapter: new InMemoryAdapter() });
    assert.throws(() => locker.close({ release: 'no' }), (e) => e instanceof ValidationError && e.field === 'release');
    assert.throws(() => locker.close({ relase: false }), (e) => e instanceof ValidationError && /did you mean release/.test(e.message));
    assert.throws(() => locker.close(1), (e) => e instanceof ValidationError && e.field === 'options');
    await locker.close({ release: true });
  });

  it('a retry policy whose retries end long before its timeout warns once, with a code', async () => {
    const warnings = [];
    const listen = (w) => w.code === 'LOCCO_RETRIES_END_FIRST' && warnings.push(w.message);
    process.on('warning', listen);
    try {
      const adapter = new InMemoryAdapter();
      // Reachable: 100 retries 200 ms apart wait up to 20 s, beyond the 10 s timeout.
      new Locker({ adapter, retry: { retries: 100, timeout: 10_000 } });
      const locker = new Locker({ adapter, retry: { retries: Infinity } });
      // Per call, merged with the Locker's: retries Infinity reaches any timeout.
      await (await locker.acquire('w1', { ttl: 1000, retry: { timeout: 10_000 } })).release();
      await new Promise((r) => setImmediate(r));
      assert.deepEqual(warnings, []);
      // The default 10 retries 200 ms apart stop after about 2 s of a 10 s timeout.
      const plain = new Locker({ adapter });
      await (await plain.acquire('w2', { ttl: 1000, retry: { timeout: 10_000 } })).release();
      new Locker({ adapter, retry: { timeout: 60_000 } });
      await new Promise((r) => setImmediate(r));
      assert.equal(warnings.length, 1, warnings.join('\n'));
      assert.match(warnings[0], /retries: 10, delay: 200 .* timeout of 10000 ms is never reached/);
    } finally {
      process.off('warning', listen);
    }
  });

  it('Locker.close() ends acquisitions already waiting with LockStateError; they take nothing', async () => {
    const adapter = new InMemoryAdapter();
    const other = new Locker({ adapter, retry: { retries: 0 } });
    const held = await other.acquire('c4', { ttl: 10_000 });
    const read = await other.acquireRead('c5', { ttl: 10_000 });
    const permit = await other.acquirePermit('c7', { limit: 1, ttl: 10_000 });
    const locker = new Locker({ adapter });
    const patient = { retries: 1000, delay: 20 };
    const outcomes = Promise.allSettled([
      locker.acquire('c4', { ttl: 10_000, retry: patient }),
      locker.acquireWrite('c5', { ttl: 10_000, retry: patient }),
      locker.acquireMany(['c6', 'c4'], { ttl: 10_000, retry: patient }),
      locker.acquirePermit('c7', { limit: 1, ttl: 10_000, retry: patient }),
    ]);
    await sleep(100);
    await locker.close();
    // What they waited for comes free only now, after the Locker closed.
    await Promise.all([held.release(), read.release(), permit.release()]);
    for (const outcome of await outcomes) {
      assert.equal(outcome.status, 'rejected', `resolved after close: ${outcome.value}`);
      assert.ok(outcome.reason instanceof LockStateError, String(outcome.reason));
    }
    for (const k of ['c4', 'c6']) {
      const l = await other.tryAcquire(k, { ttl: 1000 });
      assert.ok(l, `${k} was left held`);
      await l.release();
    }
    const w = await other.tryAcquireWrite('c5', { ttl: 1000 });
    assert.ok(w, 'the write key or a read was left held');
    await w.release();
    const p = await other.tryAcquirePermit('c7', { limit: 1, ttl: 1000 });
    assert.ok(p, 'the permit or the turn was left held');
    await p.release();
  });

  it('a grant that arrives after Locker.close() is given back, and the acquisition rejects', async () => {
    const adapter = new MapAdapter();
    const grant = adapter.acquire.bind(adapter);
    let answer;
    adapter.acquire = (input) => new Promise((resolve) => (answer = () => resolve(grant(input))));
    const locker = new Locker({ adapter });
    const acquiring = locker.acquire('c8', { ttl: 10_000 });
    const outcome = acquiring.then(
      (lock) => ({ lock }),
      (error) => ({ error }),
    );
    await until(() => answer !== undefined);
    await locker.close();
    answer();
    const { lock, error } = await outcome;
    assert.equal(lock, undefined, `a ${lock?.state} Lock came back from a closed Locker`);
    assert.ok(error instanceof LockStateError, String(error));
    await until(() => adapter.entries.size === 0);
  });

  it('await using closes a Locker', async () => {
    const adapter = new InMemoryAdapter();
    let lock;
    {
      await using locker = new Locker({ adapter });
      lock = await locker.acquire('d1', { ttl: 10_000 });
    }
    assert.equal(lock.state, 'released');
  });
});

describe('user callbacks never run inside the engine', () => {
  it('onEvent and a lost signal\'s listeners run after the native call returns, and may call back in', async () => {
    let t = 0;
    const adapter = new InMemoryAdapter({ now: () => t });
    const seen = [];
    let returned = false;
    const other = new Locker({ adapter, retry: { retries: 0 } });
    const locker = new Locker({
      adapter,
      now: () => t,
      onEvent: (e) => {
        // Calling back into the engine from a handler is safe once it is not mid-poll.
        if (e.type === 'acquired') other.tryAcquire('elsewhere', { ttl: 1000 }).then((l) => l && l.release());
        seen.push([e.type, returned]);
      },
    });
    const acquiring = locker.acquire('cb', { ttl: 1000 });
    returned = true;
    const lock = await acquiring;
    assert.deepEqual(seen[0], ['acquired', true], 'onEvent ran after the acquire call returned');
    const signal = lock.signal;
    let listenerRan = false;
    let released;
    signal.addEventListener('abort', () => {
      listenerRan = true;
      released = lock.release(); // re-enters the engine from the listener
    });
    t = 5000;
    assert.equal(lock.state, 'lost'); // the engine notices here; the listener waits
    assert.equal(listenerRan, false, 'no listener ran inside the getter');
    assert.equal(lock.signal.aborted, true, 'the signal agrees with state once read');
    assert.equal(listenerRan, true);
    assert.equal(await released, false);
  });
});
