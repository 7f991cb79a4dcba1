// Leader election: every instance tries to take one key; the winner holds it with a heartbeat
// (autoExtend) and does the leader's work until it steps down or its lease is lost; the others
// keep trying and one takes over.
// Three instances share one in-memory backend here; give them a RedisAdapter (or another
// network adapter) to elect across processes.
// Run: node examples/leader-election.mjs
import { Locker } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const adapter = new InMemoryAdapter();
const terms = [];

async function instance(name, stop) {
  const locker = new Locker({ adapter });
  while (!stop.aborted) {
    const lease = await locker.tryAcquire('leader', { ttl: 300, autoExtend: { maxHold: 60_000 } });
    if (lease === null) {
      await sleep(50); // someone else leads: look again soon
      continue;
    }
    console.log(`${name} is the leader (term ${terms.length + 1})`);
    terms.push(name);
    // Leader's work: one unit per tick, while the lease holds. lease.signal aborts on a loss.
    for (let tick = 0; tick < 3 && !lease.signal.aborted; tick++) await sleep(150);
    await lease.release(); // step down after three ticks so the example shows a hand-over
    console.log(`${name} steps down`);
    await sleep(100); // let another instance win the next term
  }
}

const stop = new AbortController();
const running = ['node-a', 'node-b', 'node-c'].map((name) => instance(name, stop.signal));
await sleep(2_000);
stop.abort();
await Promise.all(running);
console.log(`terms: ${terms.join(' -> ')}`);
if (new Set(terms).size < 2) throw new Error('expected leadership to change hands');
