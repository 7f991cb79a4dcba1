// locco-rs/otel: a Locker's events recorded through the real @opentelemetry/api, on a meter
// provider registered globally here that keeps every measurement in memory; and the clear
// error when the package is not installed.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { metrics } from '@opentelemetry/api';
import { Locker, ValidationError } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { lockMetrics } from 'locco-rs/otel';

const root = new URL('../..', import.meta.url).pathname;
const { version } = await import('locco-rs/package.json', { with: { type: 'json' } }).then((m) => m.default);

/** A MeterProvider that keeps each instrument's options and measurements: { kind, options, points }. */
function memoryMeterProvider() {
  const instruments = new Map();
  const meters = [];
  const make = (kind, method) => (name, options) => {
    const instrument = { kind, options, points: [] };
    instruments.set(name, instrument);
    return { [method]: (value, attributes) => instrument.points.push({ value, attributes }) };
  };
  const meter = { createCounter: make('counter', 'add'), createHistogram: make('histogram', 'record') };
  return {
    instruments,
    meters,
    getMeter(name, meterVersion) {
      meters.push({ name, version: meterVersion });
      return meter;
    },
  };
}

/** The points of instrument `name` whose attributes include `match`. */
function points(provider, name, match = {}) {
  const instrument = provider.instruments.get(name);
  assert.ok(instrument, `no instrument ${name}; made: ${[...provider.instruments.keys()].join(', ')}`);
  return instrument.points.filter((p) => Object.entries(match).every(([k, v]) => p.attributes[k] === v));
}

const sum = (list) => list.reduce((total, p) => total + p.value, 0);

/** A memory backend whose release fails `failures` times first, as a network backend's may. */
function failingRelease(failures) {
  const memory = new InMemoryAdapter();
  return {
    acquire: (input) => memory.acquire(input),
    extend: (input) => memory.extend(input),
    isHeld: (input) => memory.isHeld(input),
    async release(input) {
      if (failures-- > 0) throw new Error('connection reset');
      return memory.release(input);
    },
  };
}

describe("lockMetrics() on @opentelemetry/api's global meter", () => {
  const provider = memoryMeterProvider();
  metrics.setGlobalMeterProvider(provider);
  after(() => metrics.disable());

  it('records grants, waits, holds, contention, losses and backend failures, grouped by key prefix', async () => {
    const locker = new Locker({ adapter: new InMemoryAdapter(), onEvent: lockMetrics() });
    assert.deepEqual(provider.meters, [{ name: 'locco-rs', version }]);

    // A wait: the second caller gets the key when the first lets go, 200 ms later.
    const first = await locker.acquire('report:daily', { ttl: 5_000 });
    const second = locker.acquire('report:daily', { ttl: 5_000, retry: { retries: 100, delay: 20 } });
    await new Promise((r) => setTimeout(r, 200));
    await first.release();
    await (await second).release();

    // A loss: the hold deadline passes while the lock is held.
    const warm = await locker.acquire('cache:warm', { ttl: 5_000, autoExtend: { maxHold: 100 } });
    await new Promise((resolve) => warm.signal.addEventListener('abort', resolve, { once: true }));
    await warm.release();

    const report = { 'locco.key.group': 'report' };
    const cache = { 'locco.key.group': 'cache' };
    assert.equal(sum(points(provider, 'locco.lock.acquired', report)), 2);
    assert.equal(sum(points(provider, 'locco.lock.acquired', cache)), 1);
    assert.ok(sum(points(provider, 'locco.lock.contended', { ...report, 'locco.contended.reason': 'held' })) >= 1);
    const waits = points(provider, 'locco.lock.wait.duration', report).map((p) => p.value);
    assert.equal(waits.length, 2);
    // Seconds, not milliseconds: the second caller waited about 0.2 s.
    assert.ok(Math.max(...waits) >= 0.15 && Math.max(...waits) < 10, `waits ${waits}`);
    const holds = points(provider, 'locco.lock.hold.duration', { ...report, 'locco.lock.outcome': 'released' });
    assert.equal(holds.length, 2);
    assert.ok(holds[0].value >= 0.15 && holds[0].value < 10, `the first hold: ${holds[0].value} s`);
    assert.equal(points(provider, 'locco.lock.hold.duration', { ...cache, 'locco.lock.outcome': 'lost' }).length, 1);
    assert.deepEqual(
      points(provider, 'locco.lock.lost').map((p) => p.attributes),
      [{ ...cache, 'locco.lost.reason': 'max-hold' }],
    );

    // A release the backend fails, then one that works.
    const flaky = new Locker({ adapter: failingRelease(1), onEvent: lockMetrics() });
    const job = await flaky.acquire('job:7', { ttl: 5_000 });
    await assert.rejects(job.release(), /connection reset/);
    assert.equal(await job.release(), true);
    assert.deepEqual(
      points(provider, 'locco.backend.errors').map((p) => [p.value, p.attributes]),
      [[1, { 'locco.key.group': 'job', 'locco.operation': 'release' }]],
    );
    await locker.close();
    await flaky.close();
  });

  it("counts an acquisition's attempt that failed on the backend and was retried (retry.onBackendError)", () => {
    const record = lockMetrics();
    const before = sum(points(provider, 'locco.backend.errors', { 'locco.operation': 'acquire' }));
    record({ type: 'backendRetry', key: 'orders:9', ttl: 1000, attempt: 1, elapsedMs: 3, error: new Error('connection refused') });
    assert.deepEqual(
      points(provider, 'locco.backend.errors', { 'locco.operation': 'acquire' }).map((p) => p.attributes),
      [{ 'locco.key.group': 'orders', 'locco.operation': 'acquire' }],
    );
    assert.equal(sum(points(provider, 'locco.backend.errors', { 'locco.operation': 'acquire' })), before + 1);
  });

  it('declares seconds and bucket advice for the duration histograms', () => {
    lockMetrics();
    for (const name of ['locco.lock.wait.duration', 'locco.lock.hold.duration']) {
      const { kind, options } = provider.instruments.get(name);
      assert.equal(kind, 'histogram');
      assert.equal(options.unit, 's');
      assert.ok(options.advice.explicitBucketBoundaries.length > 5, name);
    }
    for (const name of ['locco.lock.acquired', 'locco.lock.contended', 'locco.lock.lost', 'locco.backend.errors']) {
      assert.equal(provider.instruments.get(name).kind, 'counter', name);
    }
  });
});

describe('lockMetrics({ meter, group })', () => {
  it('uses the meter and the group it is given', async () => {
    const own = memoryMeterProvider();
    const onEvent = lockMetrics({ meter: own.getMeter('app'), group: (key) => (key.startsWith('tenant-') ? 'tenant' : 'other') });
    const locker = new Locker({ adapter: new InMemoryAdapter(), onEvent });
    await (await locker.acquire('tenant-42:sync', { ttl: 1_000 })).release();
    assert.deepEqual(
      points(own, 'locco.lock.acquired').map((p) => p.attributes),
      [{ 'locco.key.group': 'tenant' }],
    );
    await locker.close();
  });

  it('refuses a wrong option with a ValidationError naming it', () => {
    assert.throws(() => lockMetrics({ metre: {} }), (e) => e instanceof ValidationError && e.field === 'metre' && /did you mean meter\?/.test(e.message));
    assert.throws(() => lockMetrics({ meter: {} }), (e) => e instanceof ValidationError && e.field === 'meter');
    assert.throws(() => lockMetrics({ group: 'prefix' }), (e) => e instanceof ValidationError && e.field === 'group');
  });
});

describe('without @opentelemetry/api installed', () => {
  // The package's JavaScript in a folder with no node_modules above it.
  const dir = mkdtempSync(join(tmpdir(), 'locco-otel-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const copy = join(dir, 'locco-rs');
  mkdirSync(copy);
  for (const f of ['package.json', 'entry', 'lib']) cpSync(join(root, f), join(copy, f), { recursive: true });

  it('lockMetrics() says to install it, or to pass a meter; with a meter it works', () => {
    const r = spawnSync(
      process.execPath,
      [
        '-e',
        `const { lockMetrics } = require(${JSON.stringify(join(copy, 'entry', 'otel.js'))});
try { lockMetrics(); console.log('no error'); } catch (e) { console.log(e.name, e.field, e.message); }
const meter = { createCounter: () => ({ add() {} }), createHistogram: () => ({ record() {} }) };
console.log(typeof lockMetrics({ meter }));`,
      ],
      { cwd: dir, encoding: 'utf8' },
    );
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^ValidationError meter .*@opentelemetry\/api is not installed: run npm install @opentelemetry\/api.*or pass \{ meter \}$/m);
    assert.match(r.stdout, /^function$/m);
  });
});
