// PostgreSQL: locco-rs against a floor written with `pg` (the same INSERT … ON CONFLICT and
// token-checked DELETE), same process, same server, same run; median of 3.
// W1: sequential acquire+release pairs on distinct keys. W2: 64 concurrent workers, each
// looping acquire+release on its own key.
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { Locker } from 'locco-rs';
import { runBackendBench } from './pairs.mjs';
import { PostgresAdapter } from 'locco-rs/postgres';
import { startPostgres } from '../__test__/support/servers.mjs';

const W1_PAIRS = Number(process.env.W1_PAIRS ?? 2_000);
const W2_WORKERS = 64;
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 5);
const TTL = 10_000;
const POOL = 10;

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


const server = await startPostgres();
const peer = floor(server.url);
const adapter = new PostgresAdapter({ url: server.url, poolSize: POOL });
await peer.setup();
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
