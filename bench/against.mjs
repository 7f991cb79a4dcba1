// This checkout against another build of locco-rs (e.g. main in a worktree), in one process,
// on one server, alternating rounds so that a noisy machine hits both alike.
// Usage: [BACKEND=redis|postgres] node bench/against.mjs /path/to/other/checkout   (both built, release)
// Prints the median W1 and W2 pairs/s of each, this checkout's ratio to the other, and the
// median of the rounds' own ratios (less moved by a round the machine slowed for both).
// The two share one JavaScript heap: a build whose facade leaves garbage slows the other too.
import { pathToFileURL } from 'node:url';
import path from 'node:path';
import { startPostgres, startRedis } from '../__test__/support/servers.mjs';

const other = process.argv[2];
if (!other) throw new Error('usage: node bench/against.mjs <other checkout>');
const ROUNDS = Number(process.env.ROUNDS ?? 5);
const W1_PAIRS = 5_000;
const BACKENDS = {
  // The W2 widths of bench/redis.mjs and bench/postgres.mjs.
  redis: { start: startRedis, module: 'redis.mjs', Adapter: 'RedisAdapter', workers: 256, options: {} },
  postgres: { start: startPostgres, module: 'postgres.mjs', Adapter: 'PostgresAdapter', workers: 64, options: { poolSize: 10 } },
};
const backend = BACKENDS[process.env.BACKEND ?? 'redis'];
if (!backend) throw new Error(`BACKEND must be one of ${Object.keys(BACKENDS).join(', ')}`);
const W2_WORKERS = backend.workers;
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 3);
const TTL = 10_000;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function build(dir, url) {
  const at = (f) => pathToFileURL(path.resolve(dir, f)).href;
  const { Locker } = await import(at('index.mjs'));
  const Adapter = (await import(at(backend.module)))[backend.Adapter];
  const adapter = new Adapter({ url, ...backend.options });
  const locker = new Locker({ adapter, retry: { retries: 0 } });
  return {
    async pair(key) {
      const lock = await locker.acquire(key, { ttl: TTL });
      await lock.release();
    },
    close: () => adapter.close(),
  };
}

async function w1(impl, tag) {
  const t0 = performance.now();
  for (let i = 0; i < W1_PAIRS; i++) await impl.pair(`w1:${tag}:${i}`);
  return W1_PAIRS / ((performance.now() - t0) / 1000);
}

async function w2(impl, tag) {
  let pairs = 0;
  const end = performance.now() + W2_SECONDS * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: W2_WORKERS }, async (_, w) => {
      while (performance.now() < end) {
        await impl.pair(`w2:${tag}:${w}`);
        pairs++;
      }
    }),
  );
  return pairs / ((performance.now() - t0) / 1000);
}

const server = await backend.start();
const impls = { this: await build(path.resolve(import.meta.dirname, '..'), server.url), other: await build(other, server.url) };
const rates = { this: { w1: [], w2: [] }, other: { w1: [], w2: [] } };
try {
  for (const impl of Object.values(impls)) await w1(impl, 'warm');
  for (let round = 0; round < ROUNDS; round++) {
    // Alternate who goes first, so that neither always runs on a warmer or quieter machine.
    const order = round % 2 ? ['other', 'this'] : ['this', 'other'];
    for (const name of order) rates[name].w1.push(await w1(impls[name], `${name}${round}`));
    for (const name of order) rates[name].w2.push(await w2(impls[name], `${name}${round}`));
  }
} finally {
  for (const impl of Object.values(impls)) await impl.close();
  await server.dispose();
}
for (const w of ['w1', 'w2']) {
  const [a, b] = [median(rates.this[w]), median(rates.other[w])];
  const perRound = median(rates.this[w].map((x, i) => x / rates.other[w][i]));
  console.log(`${w.toUpperCase()}: this ${Math.round(a)} pairs/s, other ${Math.round(b)} pairs/s, this/other ${(a / b).toFixed(2)}x (median of ${ROUNDS}); median of the rounds' ratios ${perRound.toFixed(2)}x`);
}
