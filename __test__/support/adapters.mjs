// Every Locker behaviour test runs against each of these adapters.
import { Locker } from 'locco-rs';
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
 * tryAcquires of other keys are in flight at once, each answered one replaced by the next,
 * for 2.5 s (longer than the lease, or it proves nothing; a fixed number of requests ran out
 * within the lease on a release build), and checks that it is still held at the end.
 */
export async function heldThroughFlood(assert, locker, { prefix, count }) {
  const held = await locker.acquire(`${prefix}held`, { ttl: 1500, autoExtend: { maxHold: 120_000 } });
  const t0 = performance.now();
  const end = t0 + 2500;
  const flood = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: count }, async () => {
      do flood.push(await locker.tryAcquire(`${prefix}${next++}`, { ttl: 60_000 }));
      while (performance.now() < end);
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  assert.ok(seconds > 2, `the flood took ${seconds.toFixed(1)} s, too short to outlast the lease`);
  assert.equal(held.state, 'held', `lost (${held.lostReason}) during a ${seconds.toFixed(1)} s flood`);
  assert.equal(await held.release(), true);
  await Promise.all(flood.map((l) => l?.release()));
  return seconds;
}

/**
 * Holds lock 'r' on `adapter` with auto-extension (every 500 ms, lease `ttl`) through
 * `restart()`, and checks that it is renewed afterwards (within `ttl - 1000` ms), never lost,
 * and still held on the server. Answers { locker, lock } for the checks a backend adds.
 */
export async function heldThroughRestart(assert, adapter, restart, { ttl }) {
  const events = [];
  const locker = new Locker({ adapter, onEvent: (e) => events.push(e.type) });
  const lock = await locker.acquire('r', { ttl, autoExtend: { maxHold: 60_000, interval: 500 } });
  await restart();
  const after = events.length;
  await until(() => events.slice(after).includes('extended'), ttl - 1000);
  assert.equal(lock.state, 'held', `events: ${events.join(', ')}`);
  assert.ok(!events.includes('lost'), `events: ${events.join(', ')}`);
  assert.equal(await lock.isHeld(), true);
  return { locker, lock };
}
