// A child process for the PostgreSQL fair-queue tests, driven by IPC. argv: JSON
// { url, tableName, key, role, ... }. Roles:
//   wait: acquires `key` (fencing, retry `delay`), telling { queued } after its first attempt
//     missed and { granted: fence, at } once it holds; holds `hold` ms, releases, tells
//     { released } and exits.
//   hold: acquires `key` with `ttl`, tells { held: fence } and keeps it until killed.
//   count: `n` times: acquires `key`, reads the counter row of `counter`, writes it + 1 with its
//     fence; tells { counted, violations } (a fence not above the last writer's) and exits.
import pg from 'pg';
import { Locker } from 'locco-rs';
import { PostgresAdapter } from 'locco-rs/postgres';

const args = JSON.parse(process.argv[2]);
const adapter = new PostgresAdapter({ url: args.url, tableName: args.tableName });
let queued = false;
const locker = new Locker({
  adapter,
  fencing: true,
  onEvent: (e) => {
    if (e.type === 'contended' && !queued) {
      queued = true;
      process.send({ queued: true });
    }
  },
});
const retry = { retries: Infinity, delay: args.delay ?? 5000, timeout: 120_000 };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

if (args.role === 'wait') {
  const lock = await locker.acquire(args.key, { ttl: args.ttl ?? 10_000, retry });
  process.send({ granted: lock.fence, at: Date.now() });
  await sleep(args.hold ?? 0);
  await lock.release();
  process.send({ released: true });
} else if (args.role === 'hold') {
  const lock = await locker.acquire(args.key, { ttl: args.ttl ?? 10_000, retry });
  process.send({ held: lock.fence });
  setInterval(() => {}, 60_000); // alive until killed
  await new Promise(() => {});
} else if (args.role === 'count') {
  const db = new pg.Client({ connectionString: args.url });
  await db.connect();
  let violations = 0;
  for (let i = 0; i < args.n; i++) {
    const lock = await locker.acquire(args.key, { ttl: 10_000, retry: { ...retry, delay: 50 } });
    const { rows } = await db.query(`SELECT value, fence FROM ${args.counter}`);
    if (!(Number(rows[0].fence) < lock.fence)) violations++;
    await sleep(3); // a window for a second holder to read the same value
    await db.query(`UPDATE ${args.counter} SET value = $1, fence = $2`, [rows[0].value + 1, lock.fence]);
    await lock.release();
  }
  await db.end();
  process.send({ counted: args.n, violations });
}
await adapter.close();
process.disconnect();
