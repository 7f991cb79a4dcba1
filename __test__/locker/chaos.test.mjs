// Seeded chaos: every primitive, through adapters that fail, answer late, never answer, lose
// replies and end sessions, checked after every step (see support/chaos-driver.mjs).
//
// Re-run one history:   LOCCO_CHAOS_SEED=123 node --test __test__/locker/chaos.test.mjs
// More or other seeds:  LOCCO_CHAOS_RUNS=5000 LOCCO_CHAOS_FROM=10000 node --test __test__/locker/chaos.test.mjs

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Locker } from 'locco-rs';
import { chaosAdapter, ChaosError, CHAOS_FAULTS } from 'locco-rs/testing';
import { MapAdapter } from '../support/map-adapter.mjs';
import { plan, runHistory } from '../support/chaos-driver.mjs';

const ONE = process.env.LOCCO_CHAOS_SEED;
const RUNS = Number(process.env.LOCCO_CHAOS_RUNS ?? 2000);
const FROM = Number(process.env.LOCCO_CHAOS_FROM ?? 1);
/** Histories run side by side: most of a history's time is spent waiting on timers. */
const PARALLEL = 128;
/** No new history starts after this, so the file stays within a minute on a slow machine. */
const BUDGET_MS = 30_000;

/**
 * Rules whose breaking is a known, open defect of the engine: each is reported (its
 * seeds, as a diagnostic) but does not fail the run. A rule, not seeds: whether a history
 * meets the defect depends on how busy the machine is.
 */
const KNOWN = new Map([]);

describe('chaosAdapter', () => {
  it('draws the same faults for the same calls from the same seed, and others from another', async () => {
    const faults = async (seed) => {
      const adapter = chaosAdapter(new MapAdapter(), { seed, rates: { fail: 0.3, lostReply: 0.3 } });
      for (let i = 0; i < 60; i++) {
        await adapter.acquire({ key: `k${i % 3}`, token: `t${i}`, ttl: 1000 }).catch(() => {});
        await adapter.release({ key: `k${i % 3}`, token: `t${i}` }).catch(() => {});
      }
      return adapter.chaos.log.map((e) => e.fault ?? '-').join(',');
    };
    const one = await faults(7);
    assert.equal(await faults(7), one);
    assert.notEqual(await faults(8), one);
    assert.match(one, /fail/);
    assert.match(one, /lostReply/);
  });

  it('makes each fault do what it says', async () => {
    const only = (fault, options = {}) => chaosAdapter(new MapAdapter(), { seed: 1, rates: { [fault]: 1 }, ...options });

    const fail = only('fail');
    const e1 = await fail.acquire({ key: 'k', token: 'a', ttl: 1000 }).catch((e) => e);
    assert.ok(e1 instanceof ChaosError && fail.chaos.threw(e1) && e1.applied === false);
    fail.chaos.quiet = true;
    assert.equal(await fail.isHeld({ key: 'k', token: 'a' }), false, 'a failed call never reached the backend');

    const lost = only('lostReply');
    const e2 = await lost.acquire({ key: 'k', token: 'a', ttl: 1000 }).catch((e) => e);
    assert.ok(e2 instanceof ChaosError && e2.applied === true);
    lost.chaos.quiet = true;
    assert.equal(await lost.isHeld({ key: 'k', token: 'a' }), true, 'a lost reply was applied');
    assert.equal(lost.chaos.log[0].granted, true);

    let moved = 0;
    const late = only('late', { advance: (ms) => (moved += ms) });
    assert.equal(await late.acquire({ key: 'k', token: 'a', ttl: 500 }), true);
    assert.equal(moved, 501, 'the clock moved past the lease before the answer');

    const hang = only('hang');
    const hanging = hang.acquire({ key: 'k', token: 'a', ttl: 500 });
    assert.equal(await Promise.race([hanging, new Promise((r) => setTimeout(r, 50, 'none'))]), 'none');
    hang.chaos.settleHung();
    assert.equal((await hanging.catch((e) => e)).fault, 'hang', 'settleHung fails what never answered');

    // An ended session drops what its own adapter granted, never what others hold.
    const inner = new MapAdapter();
    const ends = chaosAdapter(inner, { seed: 1, rates: { endSession: 1 } });
    ends.chaos.quiet = true;
    assert.equal(await ends.acquire({ key: 'k', token: 'a', ttl: 10_000 }), true);
    assert.equal(await ends.acquire({ key: 'j', token: 'b', ttl: 10_000 }), true);
    assert.equal(await inner.acquire({ key: 'other', token: 'x', ttl: 10_000 }), true);
    ends.chaos.quiet = false;
    const e3 = await ends.extend({ key: 'k', token: 'a', ttl: 10_000 }).catch((e) => e);
    assert.equal(e3.fault, 'endSession');
    assert.deepEqual(ends.chaos.dropped.map((d) => d.key).sort(), ['j', 'k']);
    assert.equal(await inner.isHeld({ key: 'k', token: 'a' }), false);
    assert.equal(await inner.isHeld({ key: 'other', token: 'x' }), true);
    assert.deepEqual(CHAOS_FAULTS, ['fail', 'late', 'hang', 'lostReply', 'endSession']);
  });

  it('faults only the methods named in methods', async () => {
    const adapter = chaosAdapter(new MapAdapter(), { seed: 1, rates: { fail: 1 }, methods: ['extend'] });
    assert.equal(await adapter.acquire({ key: 'k', token: 'a', ttl: 1000 }), true);
    const e = await adapter.extend({ key: 'k', token: 'a', ttl: 1000 }).catch((x) => x);
    assert.equal(e.fault, 'fail');
    assert.equal(await adapter.release({ key: 'k', token: 'a' }), true);
  });

  it('keeps the methods of the adapter it wraps, and no others', () => {
    const adapter = chaosAdapter(new MapAdapter(), { seed: 1 });
    assert.equal(typeof adapter.acquireFenced, 'function');
    assert.equal(adapter.acquireQueued, undefined);
    assert.doesNotThrow(() => new Locker({ adapter, fencing: true }));
    assert.throws(() => chaosAdapter(new MapAdapter(), { seed: 1, rates: { boom: 1 } }), /unknown fault/);
    assert.throws(() => chaosAdapter(new MapAdapter(), {}), /seed/);
  });
});

describe('seeded chaos histories', () => {
  it('keep every lock rule after every step', async (t) => {
    const seeds = ONE !== undefined ? [Number(ONE)] : Array.from({ length: RUNS }, (_, i) => FROM + i);
    const failed = new Map(); // rule -> [{ seed, result }]
    const started = performance.now();
    let ran = 0;
    let next = 0;
    const worker = async () => {
      while (next < seeds.length && (ONE !== undefined || performance.now() - started < BUDGET_MS)) {
        const seed = seeds[next++];
        const result = await runHistory(plan(seed));
        ran++;
        for (const rule of new Set(result.violations.map((v) => v.rule))) {
          if (!failed.has(rule)) failed.set(rule, []);
          failed.get(rule).push({ seed, result });
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(PARALLEL, seeds.length) }, worker));
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    t.diagnostic(`${ran} histories in ${seconds} s`);
    for (const [rule, why] of KNOWN) {
      const cases = failed.get(rule);
      if (cases === undefined) continue;
      t.diagnostic(`known (${why}): ${rule} in seeds ${cases.map((c) => c.seed).join(', ')}`);
      failed.delete(rule);
    }
    if (failed.size === 0) return;
    const parts = [];
    for (const [rule, cases] of failed) {
      const seedList = cases.map((c) => c.seed);
      parts.push(`${rule}: ${cases.length} histories, seeds ${seedList.slice(0, 12).join(', ')}${seedList.length > 12 ? ', ...' : ''}`);
    }
    const summary = parts.join('\n');
    // The shortest failing history of each rule, in full, to replay and read.
    for (const [rule, cases] of failed) {
      const first = cases.reduce((a, b) => (a.result.report().length <= b.result.report().length ? a : b));
      const text = [
        `--- ${rule}: replay with LOCCO_CHAOS_SEED=${first.seed} node --test __test__/locker/chaos.test.mjs`,
        ...first.result.violations.map((v) => `${v.rule}: ${v.text}`),
        first.result.report(),
      ].join('\n');
      console.log(text);
    }
    assert.fail(`${ran} histories, some broke a rule:\n${summary}`);
  });
});
