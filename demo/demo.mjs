// npm run demo: two workers contend for one key on the in-memory backend, each holding it
// with a heartbeat; then a worker whose lease ran out tries a fenced write and is refused.
import { Locker } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

const start = performance.now();
const stamp = () => `${String(Math.round(performance.now() - start)).padStart(5)} ms`;
const log = (who, text) => console.log(`${stamp()}  ${who.padEnd(9)} ${text}`);

function printEvent(e) {
  const extra = { ...e };
  for (const k of ['type', 'key', 'ttl']) delete extra[k];
  if (extra.error) extra.error = String(extra.error);
  for (const k of Object.keys(extra)) if (typeof extra[k] === 'number') extra[k] = Math.round(extra[k]);
  log('event', `${e.type.padEnd(12)} ${e.key} ${JSON.stringify(extra)}`);
}

const adapter = new InMemoryAdapter();
const locker = new Locker({
  adapter,
  fencing: true,
  onEvent: printEvent,
  retry: { retries: Infinity, delay: 1000, timeout: 10_000 },
});

// The resource we protect keeps the largest fence that wrote to it, and refuses older ones.
const account = { balance: 100, fence: 0 };
function write(who, fence, change) {
  if (fence < account.fence) {
    log(who, `write refused: fence ${fence} < ${account.fence} (a later holder already wrote)`);
    return false;
  }
  account.balance += change;
  account.fence = fence;
  log(who, `wrote balance=${account.balance} with fence ${fence}`);
  return true;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function worker(name, change) {
  // withLock: the lease is 300 ms and a heartbeat extends it; maxHold caps the whole hold.
  await locker.withLock('account:1', { ttl: 300, autoExtend: { maxHold: 5000 } }, async (lock) => {
    log(name, `holds account:1 (fence ${lock.fence})`);
    await sleep(500); // longer than one lease: the heartbeat keeps it
    write(name, lock.fence, change);
  });
  log(name, 'released');
}

console.log('Two workers contend for one key:');
await Promise.all([worker('worker-a', +10), worker('worker-b', -30)]);

console.log('\nA holder whose lease ran out is fenced off:');
const stale = await locker.acquire('account:1', { ttl: 200 });
log('stale', `holds account:1 (fence ${stale.fence}), then stalls past its lease`);
await sleep(400);
log('stale', `state is now ${stale.state} (${stale.lostReason})`);
const fresh = await locker.acquire('account:1', { ttl: 1000 });
write('fresh', fresh.fence, +1);
const refused = !write('stale', stale.fence, -1000);
await fresh.release();
console.log(`\nfinal balance ${account.balance}; stale write refused: ${refused}`);
