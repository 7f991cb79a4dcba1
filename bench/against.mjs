// This checkout against another build of locco-rs (e.g. main in a worktree), in one process,
// on one server, alternating rounds so that a noisy machine hits both alike.
// Usage: [BACKEND=redis|postgres|mongo|etcd|memory] node bench/against.mjs /path/to/other/checkout   (both built, release)
// Prints the median W1 and W2 pairs/s of each, this checkout's ratio to the other, and the
// median of the rounds' own ratios (less moved by a round the machine slowed for both).
// In memory, W1 and W2 are bench/memory.mjs's sequential and contended runs (one key).
// The two share one JavaScript heap: a build whose facade leaves garbage slows the other too.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import path from 'node:path';
import { startEtcd, startMongo, startPostgres, startRedis } from '../__test__/support/servers.mjs';

const other = process.argv[2];
if (!other) throw new Error('usage: node bench/against.mjs <other checkout>');
const ROUNDS = Number(process.env.ROUNDS ?? 5);
const noServer = async () => ({ url: undefined, dispose: async () => {} });
const BACKENDS = {
  // The W2 widths of bench/redis.mjs and bench/postgres.mjs.
  redis: { start: startRedis, module: 'locco-rs/redis', Adapter: 'RedisAdapter', workers: 256, options: (s) => ({ url: s.url }) },
  postgres: {
    start: startPostgres,
    module: 'locco-rs/postgres',
    Adapter: 'PostgresAdapter',
    workers: 64,
    options: (s) => ({ url: s.url, poolSize: 10 }),
  },
  // The W1 lengths and W2 widths of bench/mongo.mjs and bench/etcd.mjs.
  mongo: { start: startMongo, module: 'locco-rs/mongo', Adapter: 'MongoAdapter', workers: 64, pairs: 1_000, options: (s) => ({ url: s.url, dbName: 'bench' }) },
  etcd: {
    start: startEtcd,
    module: 'locco-rs/etcd',
    Adapter: 'EtcdAdapter',
    workers: 16,
    pairs: 500,
    options: (s) => ({ endpoints: [s.endpoint], prefix: 'bench/' }),
  },
  // Every pair on one key; W2's workers wait their turn for it.
  memory: { start: noServer, module: 'locco-rs/memory', Adapter: 'InMemoryAdapter', workers: 8, oneKey: true, pairs: 100_000, options: () => undefined },
};
const backend = BACKENDS[process.env.BACKEND ?? 'redis'];
if (!backend) throw new Error(`BACKEND must be one of ${Object.keys(BACKENDS).join(', ')}`);
const W1_PAIRS = backend.pairs ?? 5_000;
const W2_WORKERS = backend.workers;
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 3);
const TTL = 10_000;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function build(dir, server) {
  // Through that checkout's own `exports` map, wherever its entry files live.
  const resolve = createRequire(path.resolve(dir, 'package.json')).resolve;
  const at = (specifier) => pathToFileURL(resolve(specifier)).href;
  const { Locker } = await import(at('locco-rs'));
  const Adapter = (await import(at(backend.module)))[backend.Adapter];
  const adapter = new Adapter(backend.options(server));
  // One key: a pair waits for the key, as long as it takes.
  const retry = backend.oneKey ? { retries: Infinity, delay: 1000 } : { retries: 0 };
  const locker = new Locker({ adapter, retry });
  return {
    async pair(key) {
      const lock = await locker.acquire(key, { ttl: TTL });
      await lock.release();
    },
    close: async () => adapter.close?.(),
  };
}

async function w1(impl, tag) {
  const t0 = performance.now();
  for (let i = 0; i < W1_PAIRS; i++) await impl.pair(backend.oneKey ? `w1:${tag}` : `w1:${tag}:${i}`);
  return W1_PAIRS / ((performance.now() - t0) / 1000);
}

async function w2(impl, tag) {
  let pairs = 0;
  const end = performance.now() + W2_SECONDS * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: W2_WORKERS }, async (_, w) => {
      while (performance.now() < end) {
        await impl.pair(backend.oneKey ? `w2:${tag}` : `w2:${tag}:${w}`);
        pairs++;
      }
    }),
  );
  return pairs / ((performance.now() - t0) / 1000);
}

const server = await backend.start();
const impls = { this: await build(path.resolve(import.meta.dirname, '..'), server), other: await build(other, server) };
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
