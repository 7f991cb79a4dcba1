// The acquire+release harness the backend benchmarks share: W1 sequential pairs on distinct
// keys, W2 concurrent workers each looping on its own key; median of `runs`, same run.

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const percentile = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

async function w1(impl, tag, pairs) {
  const times = [];
  const t0 = performance.now();
  for (let i = 0; i < pairs; i++) {
    const s = performance.now();
    await impl.pair(`w1:${tag}:${i}`);
    times.push(performance.now() - s);
  }
  return { rate: pairs / ((performance.now() - t0) / 1000), times };
}

async function w2(impl, tag, workers, seconds) {
  const times = [];
  const end = performance.now() + seconds * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      while (performance.now() < end) {
        const s = performance.now();
        await impl.pair(`w2:${tag}:${w}`);
        times.push(performance.now() - s);
      }
    }),
  );
  return { rate: times.length / ((performance.now() - t0) / 1000), times };
}

/**
 * Runs W1 and W2 for `ours` and the `floor` (each `{ pair(key) }`), prints pairs/s, p50/p99
 * and the ratios, and answers `{ w1Ratio, w2Ratio }`. A `bare` client (the same commands
 * written by hand over one socket, no library), when given, is measured beside them: what any
 * client could do on this machine, so that a ratio can be read against that ceiling.
 */
async function comparePairs({ ours, floor, floorName, bare, w1Pairs, w2Workers, w2Seconds, runs = 3 }) {
  await w1(floor, 'warm-f', Math.min(w1Pairs, 500));
  await w1(ours, 'warm-o', Math.min(w1Pairs, 500));
  if (bare) await w1(bare, 'warm-b', Math.min(w1Pairs, 500));
  const results = { w1: { ours: [], floor: [], bare: [] }, w2: { ours: [], floor: [], bare: [] } };
  for (let run = 0; run < runs; run++) {
    results.w1.floor.push(await w1(floor, `f${run}`, w1Pairs));
    results.w1.ours.push(await w1(ours, `o${run}`, w1Pairs));
    if (bare) results.w1.bare.push(await w1(bare, `b${run}`, w1Pairs));
    results.w2.floor.push(await w2(floor, `f${run}`, w2Workers, w2Seconds));
    results.w2.ours.push(await w2(ours, `o${run}`, w2Workers, w2Seconds));
    if (bare) results.w2.bare.push(await w2(bare, `b${run}`, w2Workers, w2Seconds));
  }
  const summary = {};
  for (const w of ['w1', 'w2']) {
    const pick = (rows) => rows.find((r) => r.rate === median(rows.map((x) => x.rate)));
    const o = pick(results[w].ours);
    const f = pick(results[w].floor);
    const b = bare ? pick(results[w].bare) : undefined;
    const line = (name, r) =>
      `  ${name.padEnd(9)} ${Math.round(r.rate).toLocaleString('en-US').padStart(9)} pairs/s   ` +
      `p50 ${percentile(r.times, 50).toFixed(2)} ms   p99 ${percentile(r.times, 99).toFixed(2)} ms`;
    console.log(
      w === 'w1'
        ? `W1: ${w1Pairs} sequential pairs, median of ${runs}`
        : `W2: ${w2Workers} workers for ${w2Seconds} s, median of ${runs}`,
    );
    console.log(line('locco-rs', o));
    console.log(line(floorName, f));
    if (b) console.log(line('bare', b));
    console.log(`  ratio     ${(o.rate / f.rate).toFixed(2)}x`);
    summary[`${w}Ratio`] = o.rate / f.rate;
    if (b) {
      console.log(`  bare/${floorName} ${(b.rate / f.rate).toFixed(2)}x, locco-rs/bare ${(o.rate / b.rate).toFixed(2)}x`);
      summary[`${w}BareRatio`] = b.rate / f.rate;
    }
  }
  console.log(JSON.stringify(summary));
  return summary;
}

/** The Locker side of a benchmark: acquire then release, no retries (keys are distinct). */
function lockerPairs(Locker, adapter, ttl) {
  const locker = new Locker({ adapter, retry: { retries: 0 } });
  return {
    async pair(key) {
      const lock = await locker.acquire(key, { ttl });
      await lock.release();
    },
  };
}

/**
 * The whole backend benchmark after set-up: compares the Locker over `adapter` with `peer`,
 * then closes both and stops the server.
 */
export async function runBackendBench({ Locker, adapter, peer, bare, server, ttl, ...shape }) {
  try {
    return await comparePairs({ ours: lockerPairs(Locker, adapter, ttl), floor: peer, bare, ...shape });
  } finally {
    await bare?.close();
    await peer.close();
    await adapter.close();
    await server.dispose();
  }
}
