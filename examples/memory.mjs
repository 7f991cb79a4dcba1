// In-memory backend: locks between the async tasks of one process, no server needed.
// Run: node examples/memory.mjs
// Node.js 24 or newer: it uses `await using` (see the README for Node 22).
import { Locker, LockHeldError } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

const locker = new Locker({
  adapter: new InMemoryAdapter(),
  retry: { retries: 0 },
  onEvent: (e) => console.log(`  event: ${e.type} ${e.key}`),
});

{
  await using lock = await locker.acquire('cart:7', { ttl: 5_000 });
  console.log(`holding ${lock.key}, state ${lock.state}`);

  // A second acquire of the same key fails at once: retries is 0.
  try {
    await locker.acquire('cart:7', { ttl: 5_000 });
  } catch (error) {
    if (!(error instanceof LockHeldError)) throw error;
    console.log(`second acquire refused: ${error.code} after ${error.attempts} attempt(s)`);
  }
} // `await using` released the lock here

const again = await locker.tryAcquire('cart:7', { ttl: 5_000 });
console.log(`after release, tryAcquire got the key: ${again !== null}`);
await again?.release();
