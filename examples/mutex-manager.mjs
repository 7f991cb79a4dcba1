// MutexManager: operations on the same id run one at a time, in arrival order; different ids
// run in parallel; a nested call on an id the chain already holds runs at once (re-entrant).
// Local here; pass { adapter } (or { redis: { url } }) to serialise across processes too.
// Run: node examples/mutex-manager.mjs
import { MutexManager, MutexTimeoutError } from 'locco-rs/mutex';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const mutexes = new MutexManager();
const log = [];

async function updateBalance(user, amount) {
  return mutexes.runOperation(`user:${user}`, async ({ currentMutex }) => {
    log.push(`start ${user} ${amount}`);
    await sleep(50);
    // Re-entrant: this chain holds user:<user> already, so this runs without waiting.
    await mutexes.runOperation(`user:${user}`, async () => log.push(`audit ${user} ${amount}`));
    log.push(`end ${user} ${amount} (queue ${currentMutex.queueSize})`);
    return amount;
  });
}

const results = await Promise.all([updateBalance('ann', 10), updateBalance('ann', -5), updateBalance('bob', 7)]);
console.log(log.join('\n'));
console.log(`results: ${results.join(', ')}`);

// A caller that cannot wait long gives up with MutexTimeoutError.
const slow = mutexes.runOperation('report', () => sleep(200));
try {
  await mutexes.runOperation('report', () => 'never', { timeoutMs: 20 });
} catch (error) {
  if (!(error instanceof MutexTimeoutError)) throw error;
  console.log(`second report call: ${error.code} after ${error.timeoutMs} ms`);
}
await slow;
await mutexes.dispose();
