import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { Locker } from 'locco-rs';
import { PostgresAdapter } from 'locco-rs/postgres';
import { startPostgres } from '../support/servers.mjs';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** One process that waits for `startAt` (epoch ms), then takes its first lock on `tableName`. */
const CHILD = `
const { Locker } = await import('locco-rs');
const { PostgresAdapter } = await import('locco-rs/postgres');
const [url, tableName, key, startAt] = process.argv.slice(1);
const adapter = new PostgresAdapter({ url, tableName, poolSize: 1 });
await new Promise((r) => setTimeout(r, Math.max(0, Number(startAt) - Date.now())));
try {
  const lock = await new Locker({ adapter }).tryAcquire(key, { ttl: 30_000 });
  console.log(lock ? 'granted' : 'not granted');
} catch (e) {
  console.log(String(e.message));
}
adapter.close();
`;

function child(args) {
  return new Promise((resolve) => {
    execFile(process.execPath, ['--input-type=module', '-e', CHILD, ...args], { cwd: ROOT, timeout: 60_000 }, (err, stdout, stderr) =>
      resolve(err ? `exit ${err.code}: ${stderr.trim()}` : stdout.trim()),
    );
  });
}

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

  it('processes starting together on a fresh table all get their first lock', async () => {
    // The shape: four processes, each with its own adapter, first use at once.
    const rounds = 4;
    const processes = 4;
    const answers = [];
    for (let round = 0; round < rounds; round++) {
      const tableName = `proc_race_${round}`;
      // A common start time after every child has loaded the binding, so they collide.
      const startAt = Date.now() + 3000;
      const got = await Promise.all(
        Array.from({ length: processes }, (_, i) => child([pg.url, tableName, `k${i}`, String(startAt)])),
      );
      answers.push(...got.map((a) => `${tableName}: ${a}`));
      assert.equal(pg.psql(`SELECT count(*) FROM ${tableName}`), String(got.filter((a) => a === 'granted').length));
    }
    assert.deepEqual(answers.filter((a) => !a.endsWith(': granted')), []);
    assert.equal(answers.length, rounds * processes);
  });
});
