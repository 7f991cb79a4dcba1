// MutexManager of this checkout against another build (e.g. main in a worktree), in one
// process, alternating rounds, as bench/against.mjs does for the Locker: separate processes
// on this 2-core machine vary by more than the few per cent a change is judged by.
// Usage: node bench/mutex-against.mjs /path/to/other/checkout   (ROUNDS, default 7)
// Sequential and contended runs as in bench/mutex.mjs (local runOperation on one id). Prints
// the median ops/s of each and the median of the rounds' own ratios, this/other.
import { createRequire } from 'node:module';
import path from 'node:path';

const other = process.argv[2];
if (!other) throw new Error('usage: node bench/mutex-against.mjs <other checkout>');
const ROUNDS = Number(process.env.ROUNDS ?? 7);
const SEQ = 100_000;
const CONTENDED = 100_000;
const WORKERS = 8;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

// Through each checkout's own `exports` map.
const managerOf = (dir) => new (createRequire(path.resolve(dir, 'package.json'))('locco-rs/mutex').MutexManager)();
const impls = { this: managerOf(path.resolve(import.meta.dirname, '..')), other: managerOf(other) };

async function sequential(manager) {
  const t0 = performance.now();
  for (let i = 0; i < SEQ; i++) await manager.runOperation('id', () => i);
  return SEQ / ((performance.now() - t0) / 1000);
}

async function contended(manager) {
  let done = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: WORKERS }, async () => {
      while (done < CONTENDED) await manager.runOperation('id', () => done++);
    }),
  );
  return CONTENDED / ((performance.now() - t0) / 1000);
}

const rates = { this: { seq: [], cont: [] }, other: { seq: [], cont: [] } };
for (const m of Object.values(impls)) {
  await sequential(m);
  await contended(m);
}
for (let round = 0; round < ROUNDS; round++) {
  // Alternate who goes first, so that neither always runs on a warmer or quieter machine.
  const order = round % 2 ? ['other', 'this'] : ['this', 'other'];
  for (const name of order) rates[name].seq.push(await sequential(impls[name]));
  for (const name of order) rates[name].cont.push(await contended(impls[name]));
}
for (const w of ['seq', 'cont']) {
  const perRound = median(rates.this[w].map((x, i) => x / rates.other[w][i]));
  const label = w === 'seq' ? 'sequential' : `contended (${WORKERS})`;
  console.log(
    `${label}: this ${Math.round(median(rates.this[w]))} ops/s, other ${Math.round(median(rates.other[w]))} ops/s; median of the rounds' ratios ${perRound.toFixed(2)}x`,
  );
}
