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
