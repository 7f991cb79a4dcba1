import assert from 'node:assert/strict';
import { it } from 'node:test';
import { Locker } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

it('a blocked event loop lets the lease run out: no extension vouches for a frozen process', async () => {
  const adapter = new InMemoryAdapter();
  const first = new Locker({ adapter });
  const second = new Locker({ adapter });
  const lock = await first.acquire('busy', { ttl: 300, autoExtend: { maxHold: 60_000 } });
  const end = performance.now() + 800;
  while (performance.now() < end) {
    // Busy: the heartbeat (due after 100 ms) cannot run while the loop is blocked.
  }
  // Still inside the same turn: the other Locker takes the key the heartbeat never renewed.
  const taken = await second.tryAcquire('busy', { ttl: 5000 });
  assert.notEqual(taken, null, 'the second Locker took the key while the first was frozen');
  assert.equal(lock.state, 'lost');
  assert.equal(lock.lostReason, 'expired');
  assert.equal(lock.signal.reason.reason, 'expired');
});

it('renewals of many locks due at once are spread over turns of the event loop', async () => {
  const COUNT = 20_000;
  // An injected clock that stands still while the locks are taken, so that every heartbeat
  // falls due at one moment when it moves on.
  let now = 1_000_000;
  // Turns are counted by a chain of setImmediate callbacks; every extension is an event, told
  // to onEvent in the turn that made it.
  let turn = 0;
  let counting = true;
  const perTurn = new Map();
  const nextTurn = () => {
    turn++;
    if (counting) setImmediate(nextTurn);
  };
  const onEvent = (e) => {
    if (e.type === 'extended') perTurn.set(turn, (perTurn.get(turn) ?? 0) + 1);
  };
  const locker = new Locker({ adapter: new InMemoryAdapter(), onEvent, now: () => now });
  // The engine sleeps until the first tick by the real timer (for the injected clock's
  // interval), then reads the clock: a short interval keeps that wait to about a second.
  const options = { ttl: 30_000, autoExtend: { interval: 1_000, maxHold: 600_000 } };
  const locks = await Promise.all(Array.from({ length: COUNT }, (_, i) => locker.acquire(`many:${i}`, options)));
  setImmediate(nextTurn);
  now += 1_000;
  const deadline = Date.now() + 30_000;
  while ([...perTurn.values()].reduce((a, b) => a + b, 0) < COUNT && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
  }
  counting = false;
  const extended = [...perTurn.values()].reduce((a, b) => a + b, 0);
  const busiest = Math.max(...perTurn.values());
  assert.equal(extended, COUNT, 'every lock was extended once');
  assert.equal(locks.filter((l) => l.state === 'held').length, COUNT, 'every lock is still held');
  // Without a budget one turn renewed all 20,000. The engine now polls about 4 ms before the
  // loop gets its turn: a few thousand renewals in a debug build, about 6,000 in a release
  // build here. So the bound is on the spread, not on a count that depends on the build.
  const turns = [...perTurn.entries()].map(([t, n]) => `${n} in turn ${t}`).join(', ');
  assert.ok(perTurn.size >= 3, `the extensions ran in ${perTurn.size} turn(s): ${turns}`);
  assert.ok(busiest <= COUNT / 2, `one turn made ${busiest} of the ${COUNT} extensions: ${turns}`);
  await locker.close();
});
