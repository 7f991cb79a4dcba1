// Every Locker behaviour test runs against each of these adapters.
import { InMemoryAdapter } from 'locco-rs/memory';
import { MapAdapter } from './map-adapter.mjs';

export const ADAPTERS = [
  ['InMemoryAdapter', (opts) => new InMemoryAdapter(opts)],
  ['JavaScript MapAdapter', (opts) => new MapAdapter(opts)],
];

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits until `cond()` is true, polling; fails after `ms`. */
export async function until(cond, ms = 5000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(10);
  }
}

/**
 * Holds one auto-extended lock (ttl 1500 ms, so 1 s of slack per heartbeat) while `count`
 * tryAcquires of other keys are in flight at once, and checks that it is still held when they
 * are done. The flood must outlast the lease (1.5 s), or it proves nothing.
 */
export async function heldThroughFlood(assert, locker, { prefix, count }) {
  const held = await locker.acquire(`${prefix}held`, { ttl: 1500, autoExtend: { maxHold: 120_000 } });
  const t0 = performance.now();
  const flood = await Promise.all(Array.from({ length: count }, (_, i) => locker.tryAcquire(`${prefix}${i}`, { ttl: 60_000 })));
  const seconds = (performance.now() - t0) / 1000;
  assert.ok(seconds > 2, `the flood took ${seconds.toFixed(1)} s, too short to outlast the lease`);
  assert.equal(held.state, 'held', `lost (${held.lostReason}) during a ${seconds.toFixed(1)} s flood`);
  assert.equal(await held.release(), true);
  await Promise.all(flood.map((l) => l?.release()));
  return seconds;
}
