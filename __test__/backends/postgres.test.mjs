import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Locker, ValidationError } from 'locco-rs';
import { PostgresAdapter, postgresLocksDdl } from 'locco-rs/postgres';
import { freePort, makeTestCertificates, startPostgres } from '../support/servers.mjs';
import { heldThroughFlood, heldThroughRestart, sleep, until } from '../support/adapters.mjs';

/** `url` with one more query parameter. */
const withParam = (url, param) => `${url}${url.includes('?') ? '&' : '?'}${param}`;

/** How many sessions run the `holdRow` sleep for `table` (not counting the asker). */
const sleepingHolders = (pg, table) =>
  pg.psql(`SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%pg_sleep(120), ''hold ${table}''%' AND pid <> pg_backend_pid()`);

/**
 * A psql session that row-locks `key` of `table`; resolves once it holds it. `end()` kills psql
 * and its server backend (which would otherwise sleep on with the row lock).
 */
async function holdRow(pg, table, key) {
  const child = pg.session(`BEGIN; SELECT * FROM ${table} WHERE key = '${key}' FOR UPDATE; SELECT pg_sleep(120), 'hold ${table}';\n`);
  await until(() => sleepingHolders(pg, table) === '1', 15_000);
  return {
    end() {
      child.kill();
      pg.psql(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(120), ''hold ${table}''%' AND pid <> pg_backend_pid()`);
    },
  };
}

/** A statement stuck behind a row lock gives no answer: a backend timeout, not contention. */
const noAnswer = (e) => e?.code === 'LOCK_BACKEND' && e.backend === 'postgres' && e.kind === 'timeout';

/**
 * An acquire blocked behind another transaction's row lock is abandoned at its budget: its
 * statement must be cancelled on the server, its connection closed rather than pooled (so a
 * late cancel cannot hit a later statement), and the pool must serve the next call at once.
 */
async function abandonedStatementIsCancelled(pg, url, table) {
  const app = `locco_${table}`;
  const adapter = new PostgresAdapter({ url: withParam(url, `application_name=${app}`), tableName: table, poolSize: 1 });
  const locker = new Locker({ adapter });
  await locker.acquire('row', { ttl: 100 });
  const pid = pg.psql(`SELECT pid FROM pg_stat_activity WHERE application_name = '${app}'`);
  assert.match(pid, /^\d+$/, 'one pooled connection');
  await sleep(150); // expired, but the row is still there
  const session = await holdRow(pg, table, 'row');
  try {
    const started = performance.now();
    const err = await locker.acquire('row', { ttl: 5000, retry: { timeout: 300 } }).catch((e) => e);
    assert.ok(noAnswer(err), String(err));
    assert.ok(performance.now() - started < 3000, `took ${performance.now() - started} ms`);
    // The blocked statement is cancelled on the server…
    const blocked = () => pg.psql(`SELECT count(*) FROM pg_stat_activity WHERE application_name = '${app}' AND wait_event_type = 'Lock'`);
    await until(() => blocked() === '0', 10_000).catch(() => assert.fail('the abandoned statement still waits for the row lock'));
    // …and its connection is closed, not handed back to the pool.
    const alive = () => pg.psql(`SELECT count(*) FROM pg_stat_activity WHERE pid = ${pid}`);
    await until(() => alive() === '0', 10_000).catch(() => assert.fail('the cancelled connection is still open'));
    // The cancel hit our statement only: the holder still sleeps with its row lock.
    assert.equal(sleepingHolders(pg, table), '1');
    // The pool (of one) serves the next acquire on a fresh connection.
    const t = performance.now();
    const next = await locker.tryAcquire('elsewhere', { ttl: 5000 });
    assert.notEqual(next, null);
    assert.ok(performance.now() - t < 3000, `next acquire took ${performance.now() - t} ms`);
    assert.equal(await next.release(), true);
    const fresh = pg.psql(`SELECT pid FROM pg_stat_activity WHERE application_name = '${app}'`);
    assert.match(fresh, /^\d+$/);
    assert.notEqual(fresh, pid);
  } finally {
    session.end();
  }
  adapter.close();
}

describe('PostgresAdapter', () => {
  let pg;
  before(async () => {
    pg = await startPostgres();
  });
  after(() => pg.dispose());

  // As on MongoDB: a heartbeat must not wait behind thousands of acquisitions on the I/O
  // thread.
  it('renews a held lock while thousands of acquisitions are in flight', async (t) => {
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'flood' });
    try {
      const seconds = await heldThroughFlood(assert, new Locker({ adapter, retry: { retries: 0 } }), { prefix: 'flood:', count: 20_000 });
      t.diagnostic(`flood, 20000 in flight, took ${seconds.toFixed(1)} s`);
    } finally {
      await adapter.close();
    }
  });

  it('refuses table names that could carry SQL, before any SQL is sent', () => {
    const shapes = [
      'locks; DROP TABLE users',
      'locks"; DROP TABLE users; --',
      "locks' OR '1'='1",
      'locks -- comment',
      'public.locks.extra',
      'lo cks',
      '"quoted"',
      'x'.repeat(64),
    ];
    for (const tableName of shapes) {
      // An unreachable URL: if anything were sent, the error would be a BackendError.
      assert.throws(
        () => new PostgresAdapter({ url: 'postgres://u:p@127.0.0.1:1/db', tableName }),
        (e) => e instanceof ValidationError && e.field === 'tableName',
        tableName,
      );
      assert.throws(() => postgresLocksDdl(tableName), ValidationError);
    }
  });

  it('refuses a fenced acquire on a table name too long for its sequence', async () => {
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'x'.repeat(58) });
    const err = await new Locker({ adapter, fencing: true }).acquire('k', { ttl: 1000 }).catch((e) => e);
    assert.ok(err instanceof ValidationError, String(err));
  });

  it('works for a role without DDL rights after a migration from postgresLocksDdl()', async () => {
    pg.psql('CREATE SCHEMA app');
    pg.psql(postgresLocksDdl('app.locks'));
    pg.psql("CREATE ROLE locker LOGIN PASSWORD 'locker-pw'");
    pg.psql('GRANT USAGE ON SCHEMA app TO locker');
    pg.psql('GRANT SELECT, INSERT, UPDATE, DELETE ON app.locks TO locker');
    pg.psql('GRANT USAGE ON SEQUENCE app.locks_fence TO locker');
    const adapter = new PostgresAdapter({ url: pg.urlFor('locker', 'locker-pw'), tableName: 'app.locks', createTable: false });
    const locker = new Locker({ adapter, fencing: true });
    const first = await locker.acquire('k', { ttl: 5000 });
    await first.release();
    const second = await locker.acquire('k', { ttl: 5000 });
    assert.ok(second.fence > first.fence);
    assert.equal(await second.release(), true);
  });

  it('names a missing table, or one without a unique key, and checks again next call', async () => {
    const missing = new PostgresAdapter({ url: pg.url, tableName: 'nowhere', createTable: false });
    const locker = new Locker({ adapter: missing });
    const err = await locker.tryAcquire('k', { ttl: 1000 }).catch((e) => e);
    assert.ok(err instanceof ValidationError, String(err));
    assert.match(err.message, /nowhere does not exist/);
    pg.psql('CREATE TABLE nowhere (key text, token text NOT NULL, expires_at timestamptz NOT NULL)');
    const err2 = await locker.tryAcquire('k', { ttl: 1000 }).catch((e) => e);
    assert.ok(err2 instanceof ValidationError);
    assert.match(err2.message, /unique index on key/);
    pg.psql('ALTER TABLE nowhere ADD PRIMARY KEY (key)');
    assert.notEqual(await locker.tryAcquire('k', { ttl: 1000 }), null);
  });

  it('gives a clear error on the first fenced acquire without USAGE on the sequence', async () => {
    pg.psql(postgresLocksDdl('seqless'));
    pg.psql("CREATE ROLE nouse LOGIN PASSWORD 'nouse-pw'");
    pg.psql('GRANT SELECT, INSERT, UPDATE, DELETE ON seqless TO nouse');
    const adapter = new PostgresAdapter({ url: pg.urlFor('nouse', 'nouse-pw'), tableName: 'seqless', createTable: false });
    const plain = await new Locker({ adapter }).acquire('k', { ttl: 1000 });
    await plain.release();
    const err = await new Locker({ adapter, fencing: true }).acquire('k', { ttl: 1000 }).catch((e) => e);
    assert.ok(err instanceof ValidationError, String(err));
    assert.match(err.message, /no USAGE on sequence seqless_fence/);
  });

  it('keeps the retry budget while another transaction holds the row', async () => {
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'rowlocked', poolSize: 1 });
    const locker = new Locker({ adapter });
    const held = await locker.acquire('row', { ttl: 100 });
    await sleep(150); // expired, but the row is still there
    const session = pg.session('BEGIN; SELECT * FROM rowlocked WHERE key = $$row$$ FOR UPDATE; SELECT pg_sleep(30);\n');
    try {
      await sleep(500); // the session holds the row lock
      const started = performance.now();
      const err = await locker.acquire('row', { ttl: 5000, retry: { timeout: 300 } }).catch((e) => e);
      const took = performance.now() - started;
      assert.ok(noAnswer(err), String(err));
      assert.ok(took < 1500, `took ${took} ms`);
      // Pool exhaustion is bounded too: two callers share the one connection, the second
      // waiting for it, and both return within their budgets.
      const t1 = performance.now();
      const both = await Promise.all([
        locker.acquire('row', { ttl: 5000, retry: { timeout: 300 } }).catch((e) => e),
        locker.acquire('row', { ttl: 5000, retry: { timeout: 300 } }).catch((e) => e),
      ]);
      assert.ok(both.every(noAnswer), String(both));
      assert.ok(performance.now() - t1 < 2000, `pool wait took ${performance.now() - t1} ms`);
      // The one pooled connection is healthy: the blocked statement was cancelled.
      const t2 = performance.now();
      assert.notEqual(await locker.tryAcquire('elsewhere', { ttl: 1000 }), null);
      assert.ok(performance.now() - t2 < 1000);
    } finally {
      session.kill();
    }
    await held.release();
  });

  it('renewals do not wait for a connection behind acquisitions blocked on another row', async () => {
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'setaside', poolSize: 2 });
    const events = [];
    const locker = new Locker({ adapter, onEvent: (e) => events.push(e) });
    await locker.acquire('blocked', { ttl: 100 });
    await sleep(150); // expired, but the row is still there for another transaction to lock
    const session = await holdRow(pg, 'setaside', 'blocked');
    let waiting;
    try {
      // The acquisitions wait for their whole budget, far longer than the lease.
      const held = await locker.acquire('held', { ttl: 1200, autoExtend: { maxHold: 60_000 } });
      waiting = Array.from({ length: 3 }, () => locker.acquire('blocked', { ttl: 10_000, retry: { timeout: 6000 } }).catch((e) => e));
      await sleep(4000);
      const extended = events.filter((e) => e.type === 'extended' && e.key === 'held').length;
      assert.equal(held.state, 'held', `lost (${held.lostReason}) while acquisitions waited on another row`);
      assert.ok(extended >= 3, `renewed ${extended} times in 4 s`);
      assert.equal(await held.release(), true);
    } finally {
      session.end();
    }
    const answers = await Promise.all(waiting);
    for (const a of answers) if (a.release) await a.release();
    await adapter.close();
  });

  it('cancels an abandoned statement and discards its connection (no TLS)', async () => {
    await abandonedStatementIsCancelled(pg, pg.url, 'cancelplain');
  });

  it('a statement timeout on every connection bounds a statement nobody cancels', async () => {
    // With connectTimeout 1000 the default statement timeout is 2 s; the acquire's own
    // lease (30 s) would wait far longer.
    const app = 'locco_stmt_timeout';
    const adapter = new PostgresAdapter({ url: withParam(pg.url, `application_name=${app}`), tableName: 'stmttimeout', poolSize: 1, connectTimeout: 1000 });
    const locker = new Locker({ adapter });
    await locker.acquire('row', { ttl: 100 });
    await sleep(150);
    const session = await holdRow(pg, 'stmttimeout', 'row');
    try {
      const started = performance.now();
      const err = await locker.acquire('row', { ttl: 30_000, retry: { retries: 0 } }).catch((e) => e);
      const took = performance.now() - started;
      assert.equal(err.code, 'LOCK_BACKEND', String(err));
      assert.equal(err.kind, 'timeout');
      assert.equal(err.serverCode, '57014');
      assert.ok(took > 1500 && took < 15_000, `took ${took} ms`);
      assert.equal(pg.psql(`SELECT count(*) FROM pg_stat_activity WHERE application_name = '${app}' AND wait_event_type = 'Lock'`), '0');
      assert.notEqual(await locker.tryAcquire('elsewhere', { ttl: 1000 }), null);
    } finally {
      session.end();
    }
    adapter.close();
  });

  it('a statement_timeout in the URL options is kept', async () => {
    const app = 'locco_own_timeout';
    const url = withParam(pg.url, `application_name=${app}&options=${encodeURIComponent('-c statement_timeout=700')}`);
    const adapter = new PostgresAdapter({ url, tableName: 'owntimeout', poolSize: 1 });
    const locker = new Locker({ adapter });
    await locker.acquire('row', { ttl: 100 });
    await sleep(150);
    const session = await holdRow(pg, 'owntimeout', 'row');
    try {
      const started = performance.now();
      const err = await locker.acquire('row', { ttl: 30_000, retry: { retries: 0 } }).catch((e) => e);
      const took = performance.now() - started;
      assert.equal(err.serverCode, '57014', String(err));
      assert.ok(took > 500 && took < 5000, `took ${took} ms`);
    } finally {
      session.end();
    }
    adapter.close();
  });

  it('inspect, list and forceRelease agree, and touch only live locks the adapter wrote', async () => {
    // A migration's table that lets an application put rows of its own beside the locks.
    pg.psql('CREATE TABLE userrows (key text PRIMARY KEY, token text, expires_at timestamptz)');
    pg.psql(`INSERT INTO userrows VALUES
      ('u:null-token', NULL, now() + interval '1 hour'),
      ('u:empty-token', '', now() + interval '1 hour'),
      ('u:no-expiry', 'precious', NULL),
      ('u:forever', 'precious', 'infinity'),
      ('u:far', 'precious', now() + interval '100 years'),
      ('u:expired', 'old', now() - interval '1 hour')`);
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'userrows', createTable: false });
    const locker = new Locker({ adapter });
    const lock = await locker.acquire('u:lock', { ttl: 60_000, holder: 'worker' });
    const others = ['u:null-token', 'u:empty-token', 'u:no-expiry', 'u:forever', 'u:far', 'u:expired'];
    for (const key of others) {
      assert.deepEqual(await locker.inspect(key), { held: false }, key);
      assert.equal(await locker.forceRelease(key), false, key);
    }
    assert.equal(pg.psql(`SELECT count(*) FROM userrows WHERE key <> 'u:lock'`), String(others.length), 'every row that is not a lock is still there');
    assert.deepEqual(
      (await locker.list({ prefix: 'u:' })).map((k) => [k.key, k.held, k.holder]),
      [['u:lock', true, 'worker']],
    );
    const seen = await locker.inspect('u:lock');
    assert.equal(seen.held, true);
    assert.equal(await locker.forceRelease('u:lock'), true);
    assert.equal(pg.psql(`SELECT count(*) FROM userrows WHERE key = 'u:lock'`), '0');
    assert.equal(await lock.release(), false);
    await adapter.close();
    // The same on a table the adapter made, with its waiter table (the queue's statements).
    const fair = new Locker({ adapter: new PostgresAdapter({ url: pg.url, tableName: 'userrowsfair' }) });
    const queued = await fair.acquire('f:lock', { ttl: 60_000 });
    pg.psql(`INSERT INTO userrowsfair VALUES ('f:forever', 'precious', 'infinity'), ('f:expired', 'old', now() - interval '1 hour')`);
    for (const key of ['f:forever', 'f:expired']) {
      assert.deepEqual(await fair.inspect(key), { held: false }, key);
      assert.equal(await fair.forceRelease(key), false, key);
    }
    assert.deepEqual((await fair.list({ prefix: 'f:' })).map((k) => k.key), ['f:lock']);
    assert.equal(await fair.forceRelease('f:lock'), true);
    assert.equal(pg.psql('SELECT count(*) FROM userrowsfair'), '2');
    assert.equal(await queued.release(), false);
  });

  it('sweepExpired removes expired rows and answers how many', async () => {
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'sweep' });
    const locker = new Locker({ adapter });
    await locker.acquire('a', { ttl: 50 });
    await locker.acquire('b', { ttl: 50 });
    await locker.acquire('c', { ttl: 60_000 });
    await sleep(120);
    assert.equal(await adapter.sweepExpired(), 2);
    assert.equal(pg.psql('SELECT count(*) FROM sweep'), '1');
  });

  it('a wrong password is an auth BackendError without the password', async () => {
    const adapter = new PostgresAdapter({ url: pg.urlFor('postgres', 'not-the-pw'), tableName: 'x' });
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 1000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.equal(err.backend, 'postgres');
    assert.equal(err.kind, 'auth');
    assert.equal(err.serverCode, '28P01');
    assert.doesNotMatch(`${err.message}`, /not-the-pw/);
  });

  it('an unreachable server is an io BackendError within the connect timeout', async () => {
    const port = await freePort();
    const adapter = new PostgresAdapter({ url: `postgres://u:secret-1@127.0.0.1:${port}/db`, connectTimeout: 1000 });
    const started = performance.now();
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 1000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.ok(['io', 'timeout'].includes(err.kind), err.kind);
    assert.ok(performance.now() - started < 3000);
    assert.doesNotMatch(err.message, /secret-1/);
  });

  it('keeps a lock held with auto-extension through a server restart', async () => {
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'restart', connectTimeout: 1000 });
    // The lease's slack (5.5 s) outlasts a restart: the row survives it, the broken pooled
    // connections are replaced, and the heartbeat goes on.
    const { locker, lock } = await heldThroughRestart(assert, adapter, () => pg.restart(), { ttl: 6000 });
    const other = await locker.acquire('after-restart', { ttl: 1000, retry: { retries: 20, delay: 100 } });
    assert.equal(other.state, 'held');
    assert.equal(await lock.release(), true);
    assert.equal(await other.release(), true);
  });
});

describe('PostgresAdapter over TLS', () => {
  let pg;
  let ca;
  before(async () => {
    const certs = makeTestCertificates();
    ca = certs.ca;
    pg = await startPostgres({ ssl: { cert: certs.cert, key: certs.key } });
  });
  after(() => pg.dispose());

  it('connects with sslmode=verify-full and a CA, and with sslmode=require', async () => {
    const verified = new PostgresAdapter({ url: `${pg.url.replace('127.0.0.1', 'localhost')}?sslmode=verify-full`, tls: { ca } });
    const lock = await new Locker({ adapter: verified }).acquire('tls', { ttl: 1000 });
    assert.equal(await lock.release(), true);
    const ours = "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE s.ssl AND a.application_name <> 'psql'";
    assert.ok(Number(pg.psql(ours)) >= 1, 'the adapter connected with TLS');
    const encrypted = new PostgresAdapter({ url: `${pg.url}?sslmode=require` });
    assert.notEqual(await new Locker({ adapter: encrypted }).tryAcquire('tls2', { ttl: 1000 }), null);
  });

  it('cancels an abandoned statement over TLS and discards its connection', async () => {
    await abandonedStatementIsCancelled(pg, `${pg.url}?sslmode=require`, 'canceltls');
  });

  it('refuses a certificate it cannot verify', async () => {
    const adapter = new PostgresAdapter({ url: `${pg.url.replace('127.0.0.1', 'localhost')}?sslmode=verify-full` });
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 1000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.equal(err.kind, 'tls');
  });
});
