// PostgreSQL: locco-rs against a floor written with `pg` (the same INSERT … ON CONFLICT and
// token-checked DELETE), same process, same server, same run; median of 3.
// W1: sequential acquire+release pairs on distinct keys. W2: 64 concurrent workers, each
// looping acquire+release on its own key.
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { Locker } from '../index.mjs';
import { PostgresAdapter } from '../postgres.mjs';
import { startPostgres } from '../__test__/support/servers.mjs';

const W1_PAIRS = Number(process.env.W1_PAIRS ?? 2_000);
const W2_WORKERS = 64;
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 5);
const RUNS = 3;
const TTL = 10_000;
const POOL = 10;

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const percentile = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

function floor(url) {
  const pool = new pg.Pool({ connectionString: url, max: POOL });
  const acquire = {
    name: 'floor-acquire',
    text:
      "INSERT INTO floor_locks AS l (key, token, expires_at) VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 millisecond') " +
      'ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at ' +
      'WHERE l.expires_at <= clock_timestamp() RETURNING 1',
  };
  const release = {
    name: 'floor-release',
    text: 'DELETE FROM floor_locks WHERE key = $1 AND token = $2 RETURNING expires_at > clock_timestamp()',
  };
  return {
    async setup() {
      await pool.query(
        'CREATE TABLE IF NOT EXISTS floor_locks (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL)',
      );
    },
    async pair(key) {
      const token = randomBytes(16).toString('hex');
      const { rowCount } = await pool.query({ ...acquire, values: [key, token, TTL] });
      if (rowCount !== 1) throw new Error('floor: key held');
      await pool.query({ ...release, values: [key, token] });
    },
    close: () => pool.end(),
  };
}

function ours(url) {
  const adapter = new PostgresAdapter({ url, poolSize: POOL });
  const locker = new Locker({ adapter, retry: { retries: 0 } });
  return {
    async setup() {},
    async pair(key) {
      const lock = await locker.acquire(key, { ttl: TTL });
      await lock.release();
    },
    close: () => adapter.close(),
  };
}

async function w1(impl, tag) {
  const times = [];
  const t0 = performance.now();
  for (let i = 0; i < W1_PAIRS; i++) {
    const s = performance.now();
    await impl.pair(`w1:${tag}:${i}`);
    times.push(performance.now() - s);
  }
  return { rate: W1_PAIRS / ((performance.now() - t0) / 1000), times };
}

async function w2(impl, tag) {
  const times = [];
  const end = performance.now() + W2_SECONDS * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: W2_WORKERS }, async (_, w) => {
      while (performance.now() < end) {
        const s = performance.now();
        await impl.pair(`w2:${tag}:${w}`);
        times.push(performance.now() - s);
      }
    }),
  );
  return { rate: times.length / ((performance.now() - t0) / 1000), times };
}

const server = await startPostgres();
const peer = floor(server.url);
const mine = ours(server.url);
await peer.setup();
await w1(peer, 'warm-p');
await w1(mine, 'warm-o');

const results = { w1: { ours: [], floor: [] }, w2: { ours: [], floor: [] } };
for (let run = 0; run < RUNS; run++) {
  results.w1.floor.push(await w1(peer, `f${run}`));
  results.w1.ours.push(await w1(mine, `o${run}`));
  results.w2.floor.push(await w2(peer, `f${run}`));
  results.w2.ours.push(await w2(mine, `o${run}`));
}

const summary = {};
for (const w of ['w1', 'w2']) {
  const pick = (rows) => rows.find((r) => r.rate === median(rows.map((x) => x.rate)));
  const o = pick(results[w].ours);
  const f = pick(results[w].floor);
  const line = (name, r) =>
    `  ${name.padEnd(9)} ${Math.round(r.rate).toLocaleString('en-US').padStart(9)} pairs/s   p50 ${percentile(r.times, 50).toFixed(2)} ms   p99 ${percentile(r.times, 99).toFixed(2)} ms`;
  console.log(w === 'w1' ? `W1: ${W1_PAIRS} sequential pairs, median of ${RUNS}` : `W2: ${W2_WORKERS} workers for ${W2_SECONDS} s, median of ${RUNS}`);
  console.log(line('locco-rs', o));
  console.log(line('pg', f));
  console.log(`  ratio     ${(o.rate / f.rate).toFixed(2)}x`);
  summary[`${w}Ratio`] = o.rate / f.rate;
}
console.log(JSON.stringify(summary));
await peer.close();
await mine.close();
await server.dispose();
