// The PostgreSQL backend's fair queue: waiters across processes take the key in the order they
// asked, a try never takes a key promised to a waiter, dead waiters and holders hold the
// queue up only for their leases, and the push channel survives losing its connection.
import assert from 'node:assert/strict';
import { fork } from 'node:child_process';
import { after, before, describe, it } from 'node:test';
import { Locker } from 'locco-rs';
import { PostgresAdapter } from 'locco-rs/postgres';
import { startPostgres } from '../support/servers.mjs';
import { sleep, until } from '../support/adapters.mjs';

const CHILD = new URL('../support/pg-fair-child.mjs', import.meta.url);
const TABLE = 'fair_locks';
/** The engine's queue lease and longest re-check (QUEUE_LEASE_MS, QUEUE_RECHECK_MS). */
const LEASE = 3000;
const RECHECK = 1000;
/** Waits long between attempts: a waiter moves on a push, or on its re-check at the latest. */
const PATIENT = { retries: Infinity, delay: 5000, timeout: 60_000 };

/** A child process (see support/pg-fair-child.mjs) and a way to await its messages. */
function child(args) {
  const proc = fork(CHILD, [JSON.stringify(args)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const messages = [];
  let wake = () => {};
  proc.on('message', (m) => {
    messages.push(m);
    wake();
  });
  const exited = new Promise((r) => proc.once('exit', r));
  const next = async (pred, ms = 20_000) => {
    const end = Date.now() + ms;
    for (;;) {
      const found = messages.find(pred);
      if (found !== undefined) return found;
      if (Date.now() > end) throw new Error(`no such message from the child: ${JSON.stringify(messages)}`);
      await new Promise((r) => {
        wake = r;
        setTimeout(r, 100);
      });
    }
  };
  return { proc, messages, next, exited };
}

describe('PostgresAdapter fair queue', () => {
  let pg;
  const adapters = [];
  const adapter = (options = {}) => {
    const a = new PostgresAdapter({ url: pg.url, tableName: TABLE, ...options });
    adapters.push(a);
    return a;
  };
  const children = [];
  const spawn = (args) => {
    const c = child({ url: pg.url, tableName: TABLE, ...args });
    children.push(c);
    return c;
  };
  /** A Locker, and the waiters of it whose first attempt has been answered (they are queued). */
  const watched = (a = adapter()) => {
    const queued = [];
    const contended = [];
    const locker = new Locker({
      adapter: a,
      fencing: true,
      onEvent: (e) => {
        if (e.type !== 'contended') return;
        contended.push(performance.now());
        if (e.attempt === 1) queued.push(e.key);
      },
    });
    return { locker, queued, contended };
  };
  const liveWaiters = (key) => pg.psql(`SELECT count(*) FROM ${TABLE}_waiters WHERE key = '${key}' AND expires_at > clock_timestamp()`);
  const lockRows = (key) => pg.psql(`SELECT count(*) FROM ${TABLE} WHERE key = '${key}'`);
  const epochMs = (sql) => Number(pg.psql(`SELECT (extract(epoch FROM (${sql})) * 1000)::bigint`));

  before(async () => {
    pg = await startPostgres();
  });
  after(async () => {
    for (const c of children) if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill('SIGKILL');
    await Promise.all(adapters.map((a) => a.close()));
    await pg.dispose();
  });

  it('grants waiters in separate processes in the order they asked', async () => {
    const { locker } = watched();
    const key = 'order';
    const held = await locker.acquire(key, { ttl: 30_000 });
    // The first asker polls least often: without a queue the later ones would barge ahead.
    const delays = [5000, 1000, 50];
    const waiters = [];
    for (const delay of delays) {
      const c = spawn({ role: 'wait', key, delay, hold: 200 });
      await c.next((m) => m.queued);
      waiters.push(c);
    }
    assert.equal(liveWaiters(key), '3');
    // The head stops for a while after the release: the key stays promised to it while the
    // others poll (the last one every 50 ms).
    waiters[0].proc.kill('SIGSTOP');
    await held.release();
    await sleep(400);
    assert.equal(lockRows(key), '0', 'nobody took the key promised to the head');
    waiters[0].proc.kill('SIGCONT');
    const grants = await Promise.all(waiters.map((c) => c.next((m) => m.granted !== undefined)));
    const fences = grants.map((g) => g.granted);
    assert.deepEqual([...fences].sort((a, b) => a - b), fences, `granted out of order: ${fences}`);
    assert.ok(fences[0] > held.fence);
    await Promise.all(waiters.map((c) => c.exited));
    assert.equal(liveWaiters(key), '0', 'each grant left the queue');
  });

  it('a try does not take a free key promised to a waiter', async () => {
    const { locker } = watched();
    const key = 'promised';
    const held = await locker.acquire(key, { ttl: 30_000 });
    const w = spawn({ role: 'wait', key });
    await w.next((m) => m.queued);
    // Stopped, the waiter cannot take its turn, but its place lives on for its lease.
    w.proc.kill('SIGSTOP');
    await held.release();
    assert.equal(lockRows(key), '0', 'the key is free');
    assert.equal(liveWaiters(key), '1');
    assert.equal(await locker.tryAcquire(key, { ttl: 1000 }), null);
    assert.equal(await adapter().acquire({ key, token: 'barger', ttl: 1000 }), false, 'nor does a direct acquire');
    w.proc.kill('SIGCONT');
    const { granted } = await w.next((m) => m.granted !== undefined);
    assert.ok(granted > held.fence);
    await w.exited;
  });

  it('a waiter killed while queued holds the others up for its place lease at most', async () => {
    const { locker, queued } = watched();
    const key = 'dead-waiter';
    const held = await locker.acquire(key, { ttl: 30_000 });
    const dead = spawn({ role: 'wait', key });
    await dead.next((m) => m.queued);
    const next = locker.acquire(key, { ttl: 10_000, retry: PATIENT });
    await until(() => queued.includes(key), 10_000);
    dead.proc.kill('SIGKILL');
    await dead.exited;
    const deadUntil = epochMs(`SELECT expires_at FROM ${TABLE}_waiters WHERE key = '${key}' ORDER BY seq LIMIT 1`);
    const released = Date.now();
    await held.release();
    const lock = await next;
    const at = Date.now();
    assert.ok(at >= deadUntil - 100, `granted ${deadUntil - at} ms before the dead waiter's place ran out`);
    assert.ok(at - released < LEASE + RECHECK + 2500, `held up ${at - released} ms`);
    await lock.release();
  });

  it('a holder killed while holding: the head gets the key when its lease ends', async () => {
    const { locker, queued } = watched();
    const key = 'dead-holder';
    const holder = spawn({ role: 'hold', key, ttl: 2500 });
    await holder.next((m) => m.held !== undefined);
    const next = locker.acquire(key, { ttl: 10_000, retry: PATIENT });
    await until(() => queued.includes(key), 10_000);
    holder.proc.kill('SIGKILL');
    const leaseEnd = epochMs(`SELECT expires_at FROM ${TABLE} WHERE key = '${key}'`);
    const lock = await next;
    const at = Date.now();
    assert.ok(at >= leaseEnd - 50, `granted ${leaseEnd - at} ms before the holder's lease ended`);
    assert.ok(at - leaseEnd < 1500, `granted ${at - leaseEnd} ms after the holder's lease ended`);
    await lock.release();
  });

  it('survives losing its LISTEN connection: waiters still get the key, and pushes come back', async () => {
    const app = 'locco_fair_listen';
    const a = adapter({ url: `${pg.url}?application_name=${app}` });
    const { locker, queued, contended } = watched(a);
    const holders = new Locker({ adapter: adapter() });
    const listening = () =>
      pg.psql(`SELECT pid FROM pg_stat_activity WHERE application_name = '${app} (locco-rs listen)' AND query LIKE 'LISTEN%'`);
    const newListener = async (old) => {
      await until(() => /^\d+$/.test(listening()) && listening() !== old, 10_000);
      return listening();
    };
    const key = 'listen';
    // Killed as a key is released: the push may go nowhere, the waiter still gets the key.
    let held = await holders.acquire(key, { ttl: 30_000 });
    let next = locker.acquire(key, { ttl: 10_000, retry: PATIENT });
    await until(() => queued.length === 1, 10_000);
    const first = await newListener(null);
    assert.equal(pg.psql(`SELECT pg_terminate_backend(${first})`), 't');
    await held.release();
    const released = Date.now();
    await (await next).release();
    assert.ok(Date.now() - released < RECHECK + 2000, `took ${Date.now() - released} ms`);
    // Killed while a waiter listens: it reconnects on its own, and pushes arrive again. The
    // release comes right after an attempt, whose re-check is a second away.
    held = await holders.acquire(key, { ttl: 30_000 });
    next = locker.acquire(key, { ttl: 10_000, retry: PATIENT });
    await until(() => queued.length === 2, 10_000);
    const second = await newListener(first);
    assert.equal(pg.psql(`SELECT pg_terminate_backend(${second})`), 't');
    const third = await newListener(second);
    const handoffs = [];
    for (let i = 0; ; i++) {
      const seen = contended.length;
      await until(() => contended.length > seen, 5000);
      const t = performance.now();
      await held.release();
      await (await next).release();
      handoffs.push(performance.now() - t);
      if (i === 2) break;
      held = await holders.acquire(key, { ttl: 30_000 });
      next = locker.acquire(key, { ttl: 10_000, retry: PATIENT });
      await until(() => queued.length === 3 + i, 10_000);
    }
    assert.equal(listening(), third, 'one LISTEN connection, kept');
    handoffs.sort((x, y) => x - y);
    assert.ok(handoffs[1] < 600, `hand-offs took ${handoffs.map(Math.round)} ms: no push`);
  });

  it('grants 100 waiters of one process, all, in the order they asked', async () => {
    const { locker, queued } = watched();
    const key = 'hundred';
    const held = await locker.acquire(key, { ttl: 60_000 });
    const order = [];
    const all = [];
    for (let i = 0; i < 100; i++) {
      all.push(
        locker.acquire(key, { ttl: 10_000, retry: PATIENT }).then(async (lock) => {
          order.push(i);
          await lock.release();
        }),
      );
      await until(() => queued.length === i + 1, 10_000);
    }
    assert.equal(liveWaiters(key), '100');
    const started = performance.now();
    await held.release();
    await Promise.all(all);
    // Pushed, a hand-off takes milliseconds; by re-checks alone, up to a second each.
    assert.ok(performance.now() - started < 20_000, `100 hand-offs took ${performance.now() - started} ms`);
    assert.deepEqual(order, Array.from({ length: 100 }, (_, i) => i));
    assert.equal(liveWaiters(key), '0');
  });

  it('keeps mutual exclusion: a fenced counter across processes loses no update', async () => {
    const counter = 'fair_counter';
    pg.psql(`CREATE TABLE ${counter} (value int NOT NULL, fence bigint NOT NULL); INSERT INTO ${counter} VALUES (0, 0)`);
    const n = 10;
    const counters = Array.from({ length: 3 }, () => spawn({ role: 'count', key: 'counter', counter, n }));
    const results = await Promise.all(counters.map((c) => c.next((m) => m.counted !== undefined, 60_000)));
    assert.deepEqual(
      results.map((r) => r.violations),
      [0, 0, 0],
      'every holder saw a larger fence than the last writer',
    );
    assert.equal(pg.psql(`SELECT value FROM ${counter}`), String(3 * n), 'no lost update');
  });
});
