import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Locker } from 'locco-rs';
import { PostgresAdapter } from 'locco-rs/postgres';
import { startPostgres } from './support/servers.mjs';

describe('PostgresAdapter createTable under concurrency', () => {
  let pg;
  before(async () => {
    pg = await startPostgres();
  });
  after(() => pg.dispose());

  it('adapters racing to create a fresh table all get their first lock', async () => {
    // Each adapter has its own pool, so each creates the table on its own server session, as
    // separate processes starting together would. Unguarded, concurrent CREATE TABLE IF NOT
    // EXISTS collides in the catalog (pg_type_typname_nsp_index) for some of them.
    const rounds = 10;
    const racers = 8;
    const failures = [];
    for (let round = 0; round < rounds; round++) {
      const tableName = `race_${round}`;
      const adapters = Array.from({ length: racers }, () => new PostgresAdapter({ url: pg.url, tableName, poolSize: 1 }));
      const results = await Promise.all(
        adapters.map((adapter, i) =>
          new Locker({ adapter }).tryAcquire(`k${i}`, { ttl: 30_000 }).catch((e) => e),
        ),
      );
      let granted = 0;
      for (const r of results) {
        if (r === null || r instanceof Error) failures.push(`${tableName}: ${r === null ? 'not granted' : r.message}`);
        else {
          assert.equal(r.state, 'held');
          granted++;
        }
      }
      for (const a of adapters) a.close();
      assert.equal(pg.psql(`SELECT count(*) FROM ${tableName}`), String(granted), 'one row per grant');
    }
    assert.deepEqual(failures, [], `${failures.length} of ${rounds * racers} first locks failed`);
  });

  it('a fenced first lock on a fresh table races safely too (table and sequence)', async () => {
    const rounds = 5;
    const racers = 8;
    const failures = [];
    for (let round = 0; round < rounds; round++) {
      const tableName = `fenced_race_${round}`;
      const adapters = Array.from({ length: racers }, () => new PostgresAdapter({ url: pg.url, tableName, poolSize: 1 }));
      const results = await Promise.all(
        adapters.map((adapter, i) =>
          new Locker({ adapter, fencing: true }).tryAcquire(`k${i}`, { ttl: 30_000 }).catch((e) => e),
        ),
      );
      const fences = [];
      for (const r of results) {
        if (r === null || r instanceof Error) failures.push(`${tableName}: ${r === null ? 'not granted' : r.message}`);
        else fences.push(r.fence);
      }
      for (const a of adapters) a.close();
      assert.equal(new Set(fences.map(String)).size, fences.length, 'fences are distinct');
    }
    assert.deepEqual(failures, [], `${failures.length} of ${rounds * racers} first locks failed`);
  });
});
