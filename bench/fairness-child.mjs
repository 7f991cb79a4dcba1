// One contender of bench/fairness.mjs: a process of its own that loops acquire → release on the
// one shared key with an empty critical section, and records every grant.
// argv[2]: JSON { backend, subject, url, key, id, ttl, base }.
//   backend: 'redis' | 'postgres'; subject: 'locco' | 'floor'; base: the parent's
//   process.hrtime.bigint() as a string, so every process's times share one origin.
// Messages: sends 'ready' after warming up, waits for { go: deadline }, loops until the
// deadline, then sends { records } and closes its connections so the process exits by itself.
import { randomBytes } from 'node:crypto';
import Redis from 'ioredis';
import pg from 'pg';
import { Locker, LockHeldError } from 'locco-rs';
import { RedisAdapter } from 'locco-rs/redis';
import { PostgresAdapter } from 'locco-rs/postgres';

const args = JSON.parse(process.argv[2]);
const base = BigInt(args.base);
// process.hrtime reads CLOCK_MONOTONIC, which is one clock for the whole machine, so times
// taken here compare with the other processes' (the parent checks holds do not overlap).
const now = () => Number(process.hrtime.bigint() - base) / 1e6;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const POLL_MS = 10;

// Redis floor: SET NX PX and the INCR of a fence counter in one script, so the floor gets its
// grant order in the same single round trip as locco-rs's fenced acquire does.
const REDIS_ACQUIRE = `
if redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then
  return redis.call('INCR', KEYS[2])
end
return false`;
const REDIS_RELEASE = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`;

// PostgreSQL floor: the adapter's own statements on a table of the same shape, the fence from
// a sequence in the same INSERT.
const PG_ACQUIRE = {
  name: 'floor-acquire',
  text:
    "INSERT INTO floor_locks AS l (key, token, expires_at) VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 millisecond') " +
    'ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at ' +
    "WHERE l.expires_at <= clock_timestamp() RETURNING nextval('floor_fence')",
};
const PG_RELEASE = { name: 'floor-release', text: 'DELETE FROM floor_locks WHERE key = $1 AND token = $2' };

/** `{ acquire(key) → { fence, release() }, close() }`; acquire waits until it has the key. */
async function subject() {
  if (args.subject === 'locco') {
    const adapter =
      args.backend === 'redis' ? new RedisAdapter({ url: args.url }) : new PostgresAdapter({ url: args.url });
    // Default retry delay; unbounded retries and a long budget so no waiter gives up in a run.
    const locker = new Locker({ adapter, fencing: true, retry: { retries: Infinity, timeout: 30_000 } });
    return {
      async acquire(key) {
        const lock = await locker.acquire(key, { ttl: args.ttl });
        return { fence: lock.fence, release: () => lock.release() };
      },
      close: () => adapter.close(),
    };
  }
  // The floors poll: one attempt, then 10 ms of sleep after each miss.
  if (args.backend === 'redis') {
    const client = new Redis(args.url);
    client.defineCommand('floorAcquire', { numberOfKeys: 2, lua: REDIS_ACQUIRE });
    client.defineCommand('floorRelease', { numberOfKeys: 1, lua: REDIS_RELEASE });
    return {
      async acquire(key) {
        const token = randomBytes(16).toString('hex');
        for (;;) {
          const fence = await client.floorAcquire(key, `${key}:fence`, token, args.ttl);
          if (fence !== null) return { fence, release: () => client.floorRelease(key, token) };
          await sleep(POLL_MS);
        }
      },
      close: () => client.quit(),
    };
  }
  const client = new pg.Client({ connectionString: args.url });
  await client.connect();
  return {
    async acquire(key) {
      const token = randomBytes(16).toString('hex');
      for (;;) {
        const { rows } = await client.query({ ...PG_ACQUIRE, values: [key, token, args.ttl], rowMode: 'array' });
        if (rows.length === 1) {
          return { fence: Number(rows[0][0]), release: () => client.query({ ...PG_RELEASE, values: [key, token] }) };
        }
        await sleep(POLL_MS);
      }
    },
    close: () => client.end(),
  };
}

const impl = await subject();

// Warm-up on a key of this process's own: connections open, scripts and statements get
// loaded, the JIT runs, before the clock starts.
for (let i = 0; i < 200; i++) {
  const grant = await impl.acquire(`${args.key}:warm:${args.id}`);
  await grant.release();
}

const go = new Promise((resolve) => process.on('message', (m) => m?.go !== undefined && resolve(m.go)));
process.send('ready');
const deadline = await go;

// One grant per row: [fence, wait ms, acquired at, release started at] (times in ms from base).
const records = [];
let gaveUp = 0;
let lastFence = -Infinity;
let failure;
while (now() < deadline) {
  const asked = now();
  let grant;
  try {
    grant = await impl.acquire(args.key);
  } catch (error) {
    // A waiter that gave up is a result to report, not a crash.
    if (error instanceof LockHeldError) {
      gaveUp++;
      continue;
    }
    throw error;
  }
  const acquired = now();
  // This process's grants come one after another, so its fences must strictly increase.
  if (!(grant.fence > lastFence)) {
    failure = `process ${args.id}: fence ${grant.fence} after ${lastFence}`;
  }
  lastFence = grant.fence;
  const releasing = now();
  await grant.release();
  records.push([grant.fence, acquired - asked, acquired, releasing]);
  if (failure) break;
}

// Wait until the records are written to the channel: disconnect() may otherwise cut them off.
await new Promise((resolve, reject) =>
  process.send({ records, gaveUp, failure, end: now() }, (error) => (error ? reject(error) : resolve())),
);
await impl.close();
process.disconnect();
if (failure) {
  console.error(`FAIL ${failure}`);
  process.exitCode = 1;
}
