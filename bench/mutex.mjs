// MutexManager: local runOperation on one id against async-mutex's runExclusive, same process,
// same run, median of 3. Sequential: 100,000 operations. Contended: 8 contenders until 100,000.
import { Mutex } from 'async-mutex';
import { MutexManager } from 'locco-rs/mutex';

const SEQ = 100_000;
const CONTENDED = 100_000;
const WORKERS = 8;
const RUNS = 3;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function sequential(run) {
  const t0 = performance.now();
  for (let i = 0; i < SEQ; i++) await run(() => i);
  return SEQ / ((performance.now() - t0) / 1000);
}

async function contended(run) {
  let done = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: WORKERS }, async () => {
      while (done < CONTENDED) await run(() => done++);
    }),
  );
  return CONTENDED / ((performance.now() - t0) / 1000);
}

const manager = new MutexManager();
const mutex = new Mutex();
const ours = (fn) => manager.runOperation('id', fn);
const peer = (fn) => mutex.runExclusive(fn);

await sequential(peer);
await sequential(ours);
await contended(peer);
await contended(ours);
const rows = { so: [], sp: [], co: [], cp: [] };
for (let i = 0; i < RUNS; i++) {
  rows.sp.push(await sequential(peer));
  rows.so.push(await sequential(ours));
  rows.cp.push(await contended(peer));
  rows.co.push(await contended(ours));
}
const fmt = (n) => Math.round(n).toLocaleString('en-US');
const [so, sp, co, cp] = [median(rows.so), median(rows.sp), median(rows.co), median(rows.cp)];
console.log(`sequential: MutexManager ${fmt(so)} ops/s, async-mutex ${fmt(sp)} ops/s, ratio ${(so / sp).toFixed(2)}x`);
console.log(`contended (${WORKERS}): MutexManager ${fmt(co)} ops/s, async-mutex ${fmt(cp)} ops/s, ratio ${(co / cp).toFixed(2)}x`);
console.log(JSON.stringify({ sequentialRatio: so / sp, contendedRatio: co / cp }));
