// Fenced write: a holder that stalls past its lease must not overwrite the work of the next
// holder. Each grant carries a fence that only grows; the storage refuses a write whose fence
// is smaller than the last one it accepted.
// The storage here is an object; in a database it is a conditional UPDATE (see the README).
// Run: node examples/fenced-write.mjs
import { Locker } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const locker = new Locker({ adapter: new InMemoryAdapter(), fencing: true });

const document = { text: 'v0', fence: 0 };
function save(text, fence) {
  if (fence < document.fence) return false; // a later holder already wrote
  Object.assign(document, { text, fence });
  return true;
}

// Holder A takes the lock, then stalls (a GC pause, a slow call) longer than its lease.
const a = await locker.acquire('doc:1', { ttl: 100 });
await sleep(200);
console.log(`A's lease: ${a.state} (${a.lostReason})`);

// Meanwhile B gets the key and writes.
const b = await locker.acquire('doc:1', { ttl: 1_000 });
console.log(`B writes with fence ${b.fence}: ${save('written by B', b.fence) ? 'accepted' : 'refused'}`);
await b.release();

// A wakes up and tries to write with its old fence.
const accepted = save('written by A', a.fence);
console.log(`A writes with fence ${a.fence}: ${accepted ? 'accepted' : 'refused'}`);
console.log(`document: ${JSON.stringify(document)}`);
if (accepted) throw new Error('the stale write went through');
