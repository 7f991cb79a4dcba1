// PostgreSQL advisory locks: locco-rs (PostgresAdapter, mode: 'advisory') against a floor
// written with `pg`: pg_try_advisory_lock then pg_advisory_unlock on a client held from the
// pool for the lock's life, the key hashed with SHA-256 in JavaScript as locco-rs does. Same
// process, same server, same run; median of 3.
// W1: sequential acquire+release pairs on distinct keys. W2: 64 concurrent workers, each
// looping acquire+release on its own key (so 64 sessions hold locks at once).
import { createHash, randomBytes } from 'node:crypto';
import pg from 'pg';
import { Locker } from 'locco-rs';
import { runBackendBench } from './pairs.mjs';
import { PostgresAdapter } from 'locco-rs/postgres';
import { startPostgres } from '../__test__/support/servers.mjs';

const W1_PAIRS = Number(process.env.W1_PAIRS ?? 2_000);
const W2_WORKERS = 64;
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 5);
const TTL = 10_000;
// One connection per held lock: room for every worker on both sides.
const POOL = W2_WORKERS + 4;

/** The number locco-rs locks for `key` under the default tableName. */
const lockNumber = (key) => createHash('sha256').update(`locco_locks:${key}`).digest().readBigInt64BE(0);

function floor(url) {
  const pool = new pg.Pool({ connectionString: url, max: POOL });
  const acquire = { name: 'floor-try', text: 'SELECT pg_try_advisory_lock($1) AS ok' };
  const release = { name: 'floor-unlock', text: 'SELECT pg_advisory_unlock($1) AS ok' };
  return {
    async pair(key) {
      // A token, as every lock has one (the Locker makes one per attempt).
      randomBytes(16).toString('hex');
      const n = lockNumber(key).toString();
      const client = await pool.connect();
      try {
        const { rows } = await client.query({ ...acquire, values: [n] });
        if (!rows[0].ok) throw new Error('floor: key held');
        await client.query({ ...release, values: [n] });
      } finally {
        client.release();
      }
    },
    close: () => pool.end(),
  };
}

const server = await startPostgres({ maxConnections: 2 * POOL + 20 });
const peer = floor(server.url);
const adapter = new PostgresAdapter({ url: server.url, mode: 'advisory', poolSize: POOL });
await runBackendBench({
  Locker,
  adapter,
  peer,
  server,
  ttl: TTL,
  floorName: 'pg',
  w1Pairs: W1_PAIRS,
  w2Workers: W2_WORKERS,
  w2Seconds: W2_SECONDS,
});
