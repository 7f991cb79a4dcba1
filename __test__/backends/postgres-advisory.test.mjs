// PostgresAdapter in mode 'advisory': session-level advisory locks, one held connection each,
// against a real server the tests start.
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { BackendError, Locker, LockLostError, ValidationError } from 'locco-rs';
import { PostgresAdapter } from 'locco-rs/postgres';
import { sleep, until } from '../support/adapters.mjs';
import { startPostgres } from '../support/servers.mjs';

const pg = await startPostgres({ maxConnections: 300 });
after(() => pg.dispose());

let spaces = 0;
/** An adapter in a lock space of its own (the hash is namespaced by tableName). */
const advisory = (opts = {}) =>
  new PostgresAdapter({ url: pg.url, mode: 'advisory', tableName: `adv_${++spaces}`, poolSize: 4, ...opts });

/** The advisory locks the server holds, as bigint numbers, with the holder's pid. */
function serverLocks() {
  const out = pg.psql(
    "SELECT ((classid::int8 << 32) | objid::int8)::text, pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted",
  );
  return out === '' ? [] : out.split('\n').map((l) => l.split('|'));
}

/** The number a string key takes, computed in SQL as the README says. */
function sqlHash(namespace, key) {
  return pg.psql(
    `SELECT ('x' || left(encode(sha256(convert_to('${namespace}:' || '${key}', 'UTF8')), 'hex'), 16))::bit(64)::bigint`,
  );
}

describe('PostgresAdapter mode: advisory', () => {
  it('refuses bad mode and keys options with a ValidationError naming the field', () => {
    const field = (f) => (e) => e instanceof ValidationError && e.field === f;
    assert.throws(() => new PostgresAdapter({ url: pg.url, mode: 'advisery' }), field('mode'));
    assert.throws(() => new PostgresAdapter({ url: pg.url, mode: 1 }), field('mode'));
    assert.throws(() => new PostgresAdapter({ url: pg.url, mode: 'advisory', keys: 'int' }), field('keys'));
    assert.throws(() => new PostgresAdapter({ url: pg.url, keys: 'integer' }), field('keys'));
    assert.throws(() => new PostgresAdapter({ url: pg.url, mode: 'table', keys: 'hash' }), field('keys'));
  });

  it('holds a session-level advisory lock on the hashed key, with no table', async () => {
    await using adapter = advisory({ tableName: 'nstest' });
    const locker = new Locker({ adapter });
    const lock = await locker.acquire('orders:42', { ttl: 10_000 });
    const want = sqlHash('nstest', 'orders:42');
    assert.equal(want, '-3457666679807163588', 'SHA-256 of "<tableName>:<key>", first 8 bytes big-endian');
    const held = serverLocks();
    assert.deepEqual(
      held.map(([n]) => n),
      [want],
    );
    assert.equal(pg.psql("SELECT to_regclass('nstest') IS NULL"), 't', 'no lock table');
    assert.equal(await lock.release(), true);
    assert.deepEqual(serverLocks(), [], 'release unlocks on the server');
  });

  it('integer keys are the lock number itself, shared with other programs', async () => {
    await using adapter = advisory({ keys: 'integer' });
    await using other = advisory({ keys: 'integer' });
    const a = new Locker({ adapter });
    const b = new Locker({ adapter: other });
    const lock = await a.acquire('12345', { ttl: 10_000 });
    assert.deepEqual(
      serverLocks().map(([n]) => n),
      ['12345'],
    );
    assert.equal(await b.tryAcquire('12345', { ttl: 10_000 }), null, 'the same integer contends');
    assert.equal(await b.tryAcquire('012345', { ttl: 10_000 }), null, 'the number is the lock, not the text');
    assert.equal(pg.psql('SELECT pg_try_advisory_lock(12345)'), 'f', 'another program sees it held');
    await lock.release();
    // A program outside locco-rs holds 777: we contend with it.
    const session = pg.session('SELECT pg_advisory_lock(777); SELECT pg_sleep(60);\n');
    try {
      await until(() => serverLocks().some(([n]) => n === '777'));
      assert.equal(await a.tryAcquire('777', { ttl: 10_000 }), null);
    } finally {
      const [[, pid]] = serverLocks().filter(([n]) => n === '777');
      pg.psql(`SELECT pg_terminate_backend(${pid})`);
      session.kill();
    }
    await until(() => !serverLocks().some(([n]) => n === '777'));
    const freed = await a.tryAcquire('777', { ttl: 10_000 });
    assert.ok(freed, 'free once the other session ends');
    await freed.release();
    await assert.rejects(a.acquire('k', { ttl: 1000 }), (e) => e instanceof ValidationError && e.field === 'key');
    await assert.rejects(a.acquire('9223372036854775808', { ttl: 1000 }), (e) => e instanceof ValidationError && e.field === 'key');
    const prefixed = new Locker({ adapter, keyPrefix: 'p:' });
    await assert.rejects(prefixed.acquire('1', { ttl: 1000 }), (e) => e instanceof ValidationError && e.field === 'key');
  });

  it('two adapters with the same tableName share keys; another tableName is another space', async () => {
    await using a1 = advisory({ tableName: 'shared' });
    await using a2 = advisory({ tableName: 'shared' });
    await using a3 = advisory({ tableName: 'elsewhere' });
    const lock = await new Locker({ adapter: a1 }).acquire('k', { ttl: 10_000 });
    assert.equal(await new Locker({ adapter: a2 }).tryAcquire('k', { ttl: 10_000 }), null);
    const elsewhere = await new Locker({ adapter: a3 }).tryAcquire('k', { ttl: 10_000 });
    assert.ok(elsewhere);
    await Promise.all([lock.release(), elsewhere.release()]);
  });

  it('a terminated connection loses the lock at once (reason session) and frees the key', async () => {
    await using adapter = advisory();
    const space = `adv_${spaces}`;
    await using other = advisory({ tableName: space });
    const locker = new Locker({ adapter });
    const events = [];
    const watched = new Locker({ adapter, onEvent: (e) => events.push(e) });
    const lock = await watched.acquire('k', { ttl: 60_000 });
    const [[, pid]] = serverLocks().filter(([n]) => n === sqlHash(space, 'k'));
    const aborted = new Promise((resolve) => lock.signal.addEventListener('abort', resolve, { once: true }));
    const t0 = performance.now();
    pg.psql(`SELECT pg_terminate_backend(${pid})`);
    await aborted;
    const took = performance.now() - t0;
    assert.ok(took < 2000, `the signal aborted after ${took} ms, not at the lease end`);
    assert.equal(lock.state, 'lost');
    assert.equal(lock.lostReason, 'session');
    assert.ok(lock.signal.reason instanceof LockLostError);
    assert.equal(lock.signal.reason.reason, 'session');
    assert.equal(events.find((e) => e.type === 'lost')?.reason, 'session');
    const taken = await new Locker({ adapter: other }).tryAcquire('k', { ttl: 10_000 });
    assert.ok(taken, 'another locker takes the key');
    assert.equal(await lock.release(), false);
    assert.ok(await locker.tryAcquire('k2', { ttl: 1000 }), 'the adapter still works');
    await taken.release();
  });

  it('a session that ends between the grant and the Lock is lost at once', async () => {
    await using adapter = advisory();
    const space = `adv_${spaces}`;
    await using other = advisory({ tableName: space });
    const n = sqlHash(space, 'k');
    const pending = new Locker({ adapter }).acquire('k', { ttl: 60_000 });
    // The event loop stays busy from here: the server grants the lock, its session is
    // terminated and the adapter sees it end, all before the engine reads the grant.
    const end = Date.now() + 10_000;
    let pid;
    while (!pid && Date.now() < end) pid = serverLocks().find(([k]) => k === n)?.[1];
    assert.ok(pid, 'the server granted the lock');
    pg.psql(`SELECT pg_terminate_backend(${pid})`);
    while (serverLocks().some(([k]) => k === n) && Date.now() < end);
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 500);
    const lock = await pending;
    await until(() => lock.signal.aborted, 3000).catch(() => assert.fail(`the lock reads ${lock.state} with its session gone`));
    assert.equal(lock.state, 'lost');
    assert.equal(lock.lostReason, 'session');
    assert.ok(lock.signal.reason instanceof LockLostError);
    const taken = await new Locker({ adapter: other }).tryAcquire('k', { ttl: 10_000 });
    assert.ok(taken, 'the key is free for another process');
    await taken.release();
  });

  it('a release whose unlock fails ends the session and reports the lock lost, not released', async () => {
    pg.psql("CREATE ROLE unlocker LOGIN PASSWORD 'unlocker-pw'");
    await using adapter = advisory({ url: pg.urlFor('unlocker', 'unlocker-pw') });
    const space = `adv_${spaces}`;
    await using other = advisory({ tableName: space });
    const events = [];
    const lock = await new Locker({ adapter, onEvent: (e) => events.push(e.type) }).acquire('k', { ttl: 60_000 });
    // The unlock now fails on the server, on a connection that still works.
    pg.psql('REVOKE EXECUTE ON FUNCTION pg_advisory_unlock(bigint) FROM PUBLIC');
    let answer;
    try {
      answer = await lock.release().catch((e) => e);
    } finally {
      pg.psql('GRANT EXECUTE ON FUNCTION pg_advisory_unlock(bigint) TO PUBLIC');
    }
    assert.ok(answer instanceof BackendError && answer.backend === 'postgres', `release answered ${answer}`);
    await until(() => lock.signal.aborted, 3000).catch(() => assert.fail(`the lock reads ${lock.state} after its session was closed`));
    assert.equal(lock.state, 'lost');
    assert.equal(lock.lostReason, 'session');
    assert.ok(events.includes('lost') && events.includes('releaseFailed') && !events.includes('released'), events.join(', '));
    // Closing the session freed the key on the server.
    await until(() => !serverLocks().some(([k]) => k === sqlHash(space, 'k')), 3000);
    const taken = await new Locker({ adapter: other }).tryAcquire('k', { ttl: 10_000 });
    assert.ok(taken);
    await taken.release();
    assert.equal(await lock.release(), false);
  });

  it('with every pooled connection holding a lock, an acquire waiting for one fails at once', async () => {
    await using adapter = advisory({ poolSize: 2 });
    const locker = new Locker({ adapter });
    const x = await locker.acquire('x', { ttl: 30_000 });
    const t0 = performance.now();
    const answers = await Promise.all(['y', 'z'].map((k) => locker.acquire(k, { ttl: 30_000, retry: { timeout: 8000 } }).catch((e) => e)));
    const took = performance.now() - t0;
    const failed = answers.filter((a) => a instanceof Error);
    assert.equal(failed.length, 1, answers.map(String).join(', '));
    assert.ok(failed[0] instanceof BackendError && /poolSize/.test(failed[0].message), String(failed[0]));
    assert.ok(took < 3000, `failed after ${took.toFixed(0)} ms, not at once`);
    await Promise.all([x, ...answers.filter((a) => !(a instanceof Error))].map((l) => l.release()));
  });

  it('forceRelease and list are refused and never touch a session that holds the number', async () => {
    await using adapter = advisory({ keys: 'integer' });
    const locker = new Locker({ adapter });
    const session = pg.session('SELECT pg_advisory_lock(4242); SELECT pg_sleep(60);\n');
    try {
      await until(() => serverLocks().some(([n]) => n === '4242'));
      const [[, pid]] = serverLocks().filter(([n]) => n === '4242');
      await assert.rejects(locker.forceRelease('4242'), (e) => e instanceof ValidationError && e.field === 'mode');
      await assert.rejects(locker.list(), (e) => e instanceof ValidationError && e.field === 'mode');
      assert.deepEqual(serverLocks().filter(([n]) => n === '4242'), [['4242', pid]], 'the other session still holds it');
    } finally {
      pg.psql("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242");
      session.kill();
    }
  });

  it('a server restart loses every held lock, and acquiring works again after', async () => {
    await using adapter = advisory({ connectTimeout: 2000 });
    const locker = new Locker({ adapter });
    const locks = await Promise.all(['a', 'b', 'c'].map((k) => locker.acquire(k, { ttl: 60_000 })));
    await pg.restart();
    await until(() => locks.every((l) => l.signal.aborted), 5000).catch((e) => {
      throw new Error(`${e.message}: ${JSON.stringify(locks.map((l) => [l.state, l.lostReason, l.signal.aborted]))}`);
    });
    for (const l of locks) assert.equal(l.lostReason, 'session');
    const again = await locker.acquire('a', { ttl: 10_000, retry: { retries: 20, delay: 100 } });
    assert.equal(again.state, 'held');
    assert.equal(await again.isHeld(), true);
    await again.release();
  });

  it('holds 200 locks from one process with a pool sized for them', async () => {
    await using adapter = advisory({ poolSize: 201 });
    const locker = new Locker({ adapter });
    const locks = await Promise.all(
      Array.from({ length: 200 }, (_, i) => locker.acquire(`many:${i}`, { ttl: 30_000, retry: { retries: 50, delay: 50 } })),
    );
    assert.equal(serverLocks().length, 200);
    assert.equal(new Set(serverLocks().map(([, pid]) => pid)).size, 200, 'one session per lock');
    const ok = await Promise.all(locks.map((l) => l.release()));
    assert.ok(ok.every(Boolean));
    assert.equal(serverLocks().length, 0);
  });

  it('a pool whose every connection holds a lock fails with a BackendError, not contention', async () => {
    await using adapter = advisory({ poolSize: 2 });
    const locker = new Locker({ adapter });
    const held = [await locker.acquire('x', { ttl: 10_000 }), await locker.acquire('y', { ttl: 10_000 })];
    await assert.rejects(
      locker.acquire('z', { ttl: 10_000 }),
      (e) => e instanceof BackendError && e.backend === 'postgres' && /poolSize/.test(e.message),
    );
    await held[0].release();
    const z = await locker.acquire('z', { ttl: 10_000 });
    await Promise.all([z.release(), held[1].release()]);
  });

  it('fencing tokens grow, from a sequence made on first use', async () => {
    await using adapter = advisory({ tableName: 'fenced_adv' });
    const locker = new Locker({ adapter, fencing: true });
    const fences = [];
    for (let i = 0; i < 3; i++) {
      const lock = await locker.acquire('f', { ttl: 10_000 });
      fences.push(lock.fence);
      assert.equal(await locker.tryAcquire('f', { ttl: 10_000 }), null, 'a refused try takes no token');
      await lock.release();
    }
    assert.ok(fences.every((f, i) => Number.isSafeInteger(f) && (i === 0 || f > fences[i - 1])), String(fences));
    assert.equal(Number(pg.psql('SELECT last_value FROM fenced_adv_fence')), fences[2], 'no value taken by refused tries');
    await using noDdl = advisory({ tableName: 'missing_adv', createTable: false });
    await assert.rejects(
      new Locker({ adapter: noDdl, fencing: true }).acquire('f', { ttl: 1000 }),
      (e) => e instanceof ValidationError && /sequence/.test(e.message),
    );
  });

  it('a lease that runs out unlocks on the server, so the key is free after the TTL', async () => {
    await using adapter = advisory();
    const locker = new Locker({ adapter });
    // A psql call blocks the event loop for a few hundred ms on a busy machine: a lease of
    // 1.5 s outlasts it.
    const lock = await locker.acquire('ttl', { ttl: 1500 });
    assert.equal(serverLocks().length, 1);
    await sleep(2000);
    assert.equal(lock.state, 'lost');
    await until(() => serverLocks().length === 0, 2000);
    assert.equal(await lock.extend(1000).catch((e) => e.code), 'LOCK_LOST');
    const next = await locker.tryAcquire('ttl', { ttl: 1000 });
    assert.ok(next);
    await next.release();
  });

  it('auto-extension keeps the session lock past its TTL', async () => {
    await using adapter = advisory();
    const locker = new Locker({ adapter });
    const lock = await locker.acquire('ax', { ttl: 1500, autoExtend: { maxHold: 10_000 } });
    await sleep(3000);
    assert.equal(lock.state, 'held');
    assert.equal(await lock.isHeld(), true);
    assert.equal(serverLocks().length, 1);
    await lock.release();
  });

  it('closing the adapter ends its sessions: held locks are lost', async () => {
    const adapter = advisory();
    const lock = await new Locker({ adapter }).acquire('c', { ttl: 60_000 });
    await adapter.close();
    await until(() => lock.signal.aborted, 2000);
    assert.equal(lock.lostReason, 'session');
    await until(() => serverLocks().length === 0, 2000);
  });
});
