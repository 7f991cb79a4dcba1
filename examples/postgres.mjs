// PostgreSQL backend. The URL comes from DATABASE_URL
// (default postgres://postgres:postgres@127.0.0.1:5432/postgres). The adapter creates its table
// (locco_locks) on first use unless you pass createTable: false.
// Run: DATABASE_URL=postgres://user:password@127.0.0.1:5432/app node examples/postgres.mjs
// Node.js 24 or newer: it uses `await using` (see the README for Node 22).
import { Locker } from 'locco-rs';
import { PostgresAdapter } from 'locco-rs/postgres';

const url = process.env.DATABASE_URL ?? 'postgres://postgres:postgres@127.0.0.1:5432/postgres';
console.log(`PostgreSQL at ${url.replace(/\/\/[^@/]*@/, '//***@')} (set DATABASE_URL to change it)`);

await using adapter = new PostgresAdapter({ url, connectTimeout: 2_000 });
const locker = new Locker({ adapter, fencing: true });

{
  await using lock = await locker.acquire('report:monthly', { ttl: 30_000 });
  console.log(`holding ${lock.key} with fence ${lock.fence}`);
  const other = await locker.tryAcquire('report:monthly', { ttl: 30_000 });
  console.log(`a second holder gets: ${other}`);
}

// Postgres keeps expired rows until a key is taken again; sweep them now and then.
console.log(`expired rows removed: ${await adapter.sweepExpired()}`);
