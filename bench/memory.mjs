// In-memory acquire+release against async-mutex, same process, same run; median of 3.
// Sequential: 100,000 pairs on one key. Contended: 8 workers looping on one key until
// 100,000 acquisitions (at 10,000 one stall of the machine moved the ratio). Prints ops/s,
// the ratio, the share of acquisitions that changed owner, and the longest wait.
// async-mutex ships two builds: `import` gets its ES module (native generators), `require` its
// CommonJS one (a generator state machine), which hands off much faster under contention. The
// ratios are against the ES module, which is what this file imports; the CommonJS build is
// measured beside it, so that the figure says which one it is.
import { createRequire } from 'node:module';
import { Mutex } from 'async-mutex';
import { Locker } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

const SEQ = 100_000;
const CONTENDED = 100_000;
const WORKERS = 8;
const RUNS = 3;

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function sequential(pair) {
  const t0 = performance.now();
  for (let i = 0; i < SEQ; i++) await pair();
  return SEQ / ((performance.now() - t0) / 1000);
}

async function contended(acquire) {
  let done = 0;
  let changes = 0;
  let last = -1;
  let longest = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: WORKERS }, async (_, w) => {
      while (done < CONTENDED) {
        const asked = performance.now();
        const release = await acquire();
        longest = Math.max(longest, performance.now() - asked);
        if (done < CONTENDED) {
          done++;
          if (last !== w) changes++;
          last = w;
        }
        await release();
      }
    }),
  );
  return { opsPerSec: CONTENDED / ((performance.now() - t0) / 1000), changed: changes / CONTENDED, longest };
}

const locker = new Locker({ adapter: new InMemoryAdapter(), retry: { retries: Infinity, delay: 1000 } });
const mutex = new Mutex();
const cjsMutex = new (createRequire(import.meta.url)('async-mutex').Mutex)();
const opts = { ttl: 30_000 };

const oursPair = async () => {
  const lock = await locker.acquire('seq', opts);
  await lock.release();
};
const peerPair = async () => {
  const release = await mutex.acquire();
  release();
};
const oursAcquire = async () => {
  const lock = await locker.acquire('contended', opts);
  return () => lock.release();
};
const acquireOf = (m) => async () => {
  const release = await m.acquire();
  return async () => release();
};
const peerAcquire = acquireOf(mutex);
const cjsAcquire = acquireOf(cjsMutex);

// One unmeasured round of each, so the JIT has compiled both sides before timing starts.
await sequential(peerPair);
await sequential(oursPair);
await contended(peerAcquire);
await contended(cjsAcquire);
await contended(oursAcquire);

const rows = { seqOurs: [], seqPeer: [], conOurs: [], conPeer: [], conCjs: [] };
for (let run = 0; run < RUNS; run++) {
  rows.seqPeer.push(await sequential(peerPair));
  rows.seqOurs.push(await sequential(oursPair));
  rows.conPeer.push(await contended(peerAcquire));
  rows.conCjs.push(await contended(cjsAcquire));
  rows.conOurs.push(await contended(oursAcquire));
}

const seqOurs = median(rows.seqOurs);
const seqPeer = median(rows.seqPeer);
const pick = (xs) => xs.find((x) => x.opsPerSec === median(xs.map((y) => y.opsPerSec)));
const conOurs = pick(rows.conOurs);
const conPeer = pick(rows.conPeer);
const conCjs = pick(rows.conCjs);
const fmt = (n) => Math.round(n).toLocaleString('en-US');
console.log(`sequential (${SEQ.toLocaleString('en-US')} pairs, one key), median of ${RUNS}:`);
console.log(`  locco-rs     ${fmt(seqOurs)} ops/s`);
console.log(`  async-mutex  ${fmt(seqPeer)} ops/s`);
console.log(`  ratio        ${(seqOurs / seqPeer).toFixed(2)}x`);
console.log(`contended (${WORKERS} workers, ${CONTENDED.toLocaleString('en-US')} acquisitions), median of ${RUNS}:`);
console.log(`  locco-rs     ${fmt(conOurs.opsPerSec)} ops/s, owner changed ${(conOurs.changed * 100).toFixed(1)}%, longest wait ${conOurs.longest.toFixed(1)} ms`);
console.log(`  async-mutex  ${fmt(conPeer.opsPerSec)} ops/s, owner changed ${(conPeer.changed * 100).toFixed(1)}%, longest wait ${conPeer.longest.toFixed(1)} ms`);
console.log(`  ratio        ${(conOurs.opsPerSec / conPeer.opsPerSec).toFixed(2)}x`);
console.log(`  async-mutex's CommonJS build  ${fmt(conCjs.opsPerSec)} ops/s: ratio ${(conOurs.opsPerSec / conCjs.opsPerSec).toFixed(2)}x`);
const result = {
  sequentialRatio: seqOurs / seqPeer,
  contendedRatio: conOurs.opsPerSec / conPeer.opsPerSec,
  contendedRatioCommonJs: conOurs.opsPerSec / conCjs.opsPerSec,
  ownerChanged: conOurs.changed,
};
console.log(JSON.stringify(result));
