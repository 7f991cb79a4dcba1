// The etcd adapter through a 3-member cluster's failures: the leader killed while adapters
// contend and while waiters queue, a paused member, a restarted member, and a session lease
// the cluster no longer knows. After each fault: exclusion held, nothing the adapters wrote
// outlives its lease by more than a second, and the key is never free for long while
// somebody wants it.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { BackendError, LockHeldError, Locker } from 'locco-rs';
import { EtcdAdapter } from 'locco-rs/etcd';
import { startEtcdCluster } from '../support/servers.mjs';
import { sleep, until } from '../support/adapters.mjs';

const SESSION_TTL = 3000;
const LOCK_TTL = 600;
const PLACE_LEASE = 3000;

const b64 = (s) => Buffer.from(s).toString('base64');

function rangeOf(prefix) {
  const start = Buffer.from(prefix);
  const end = Buffer.from(start);
  end[end.length - 1] += 1;
  return { key: start.toString('base64'), range_end: end.toString('base64') };
}

/** The keys under `prefix`, read from whichever running member answers. */
async function keysUnder(cluster, prefix) {
  for (let t = 0; t < 100; t++) {
    for (const m of cluster.members.filter((x) => x.running())) {
      try {
        const r = await cluster.call(m, 'kv/range', { ...rangeOf(prefix), keys_only: true });
        return (r.kvs ?? []).map((kv) => Buffer.from(kv.key, 'base64').toString());
      } catch {
        // paused, electing, or starting
      }
    }
    await sleep(50);
  }
  throw new Error('no member answered');
}

/** Waits until nothing is stored under `prefix`; fails after `ms` with what is left. */
async function emptyWithin(cluster, prefix, ms, what) {
  const end = performance.now() + ms;
  let left;
  for (;;) {
    left = await keysUnder(cluster, prefix);
    if (left.length === 0) return;
    if (performance.now() > end) break;
    await sleep(50);
  }
  const detail = [];
  for (const k of left) {
    const m = (await cluster.leader()) ?? cluster.members[0];
    const kv = (await cluster.call(m, 'kv/range', { key: b64(k) })).kvs?.[0];
    const ttl = kv?.lease ? await cluster.call(m, 'lease/timetolive', { ID: kv.lease }).catch((e) => String(e)) : null;
    detail.push({ k, value: kv && Buffer.from(kv.value ?? '', 'base64').toString(), lease: kv?.lease, ttl: ttl?.TTL, granted: ttl?.grantedTTL });
  }
  assert.fail(`${what}: still stored ${ms} ms after the last use: ${JSON.stringify(detail)}`);
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/**
 * Adapters that contend for `key` until `stop()`: each takes it (ttl 600 ms, waiting in the
 * queue), holds it 20 ms, gives it back. Another loop tries fresh free keys meanwhile: those
 * must never come back as contention. Returns what was seen: overlapping holders, the
 * longest time nobody held the key, the tries answered "held".
 */
function contend(lockers, key, prefixForFree) {
  let running = true;
  let holder = null;
  let overlaps = 0;
  const grants = [];
  const errors = [];
  let freeHeld = 0;
  let freeTried = 0;
  const workers = lockers.map(async (locker) => {
    while (running) {
      let lock;
      try {
        lock = await locker.acquire(key, { ttl: LOCK_TTL, retry: { retries: Infinity, timeout: 8000, delay: 100 } });
      } catch (e) {
        errors.push(e);
        continue;
      }
      const at = performance.now();
      if (holder && holder.state === 'held') overlaps++;
      holder = lock;
      await sleep(20);
      if (lock.state === 'held') grants.push([at, performance.now()]);
      holder = null;
      await lock.release().catch(() => {});
    }
  });
  const tries = (async () => {
    let n = 0;
    while (running) {
      n += 1;
      const locker = lockers[n % lockers.length];
      const got = await locker.tryAcquire(`${prefixForFree}${n}`, { ttl: LOCK_TTL }).then(
        (lock) => lock,
        (e) => e,
      );
      freeTried++;
      // A free key is granted, or the cluster did not answer in time (a BackendError, or a
      // grant that came after its lease: LockHeldError 'late-acquire'); never "held".
      if (got === null) freeHeld++;
      else if (got instanceof Error) {
        if (!(got instanceof BackendError || (got instanceof LockHeldError && got.reason === 'late-acquire'))) errors.push(got);
      } else await got.release().catch(() => {});
      await sleep(25);
    }
  })();
  return {
    async stop() {
      running = false;
      await Promise.all([...workers, tries]);
      grants.sort((a, b) => a[0] - b[0]);
      let longest = 0;
      for (let i = 1; i < grants.length; i++) longest = Math.max(longest, grants[i][0] - grants[i - 1][1]);
      return { overlaps, longest, grants: grants.length, errors, freeHeld, freeTried };
    },
  };
}

describe('EtcdAdapter through failures of a 3-member cluster', () => {
  let cluster;
  let adapters;
  let lockers;
  before(async () => {
    cluster = await startEtcdCluster({ size: 3 });
    adapters = [0, 1, 2].map(() => new EtcdAdapter({ endpoints: cluster.endpoints, sessionTtl: SESSION_TTL, prefix: 'fo/' }));
    lockers = adapters.map((adapter) => new Locker({ adapter }));
  });
  after(async () => {
    await Promise.all((adapters ?? []).map((a) => a.close()));
    await cluster?.dispose();
  });

  /** Runs the contention through `fault` (which returns once the cluster is whole again). */
  async function round(name, fault) {
    const key = `${name}`;
    const run = contend(lockers, key, `${name}-free-`);
    await sleep(300);
    await fault();
    await sleep(700);
    const seen = await run.stop();
    assert.equal(seen.overlaps, 0, `${name}: two holders at once`);
    assert.equal(seen.freeHeld, 0, `${name}: ${seen.freeHeld} of ${seen.freeTried} tries of a free key answered "held"`);
    assert.deepEqual(
      seen.errors.filter((e) => !(e instanceof BackendError || e instanceof LockHeldError)).map(String),
      [],
      `${name}: an undocumented failure`,
    );
    assert.ok(seen.grants > 0, `${name}: nobody got the key (${seen.errors.map(String).join('; ')})`);
    // No lock key outlives its 600 ms lease, no place its 3 s lease, by more than a second.
    await emptyWithin(cluster, `fo/${name}`, LOCK_TTL + 1000, `${name}: a lock key`);
    await emptyWithin(cluster, `fo/\x01q/${name}`, PLACE_LEASE + 1000, `${name}: a queue place`);
    assert.ok(seen.longest < SESSION_TTL + 2000, `${name}: nobody held the key for ${seen.longest.toFixed(0)} ms`);
    return seen;
  }

  it('the leader killed while adapters contend: one holder, nothing orphaned, a short wait (10 rounds)', async (t) => {
    const longest = [];
    for (let i = 0; i < 10; i++) {
      let killed;
      const seen = await round(`kill${i}`, async () => {
        killed = await cluster.leader();
        await killed.stop();
        await cluster.leader();
        await sleep(500);
        await killed.start();
        await cluster.leader();
      }).finally(async () => {
        if (killed && !killed.running()) await killed.start();
      });
      longest.push(seen.longest);
    }
    t.diagnostic(`longest wait per round (ms): ${longest.map((x) => x.toFixed(0)).join(', ')}; median ${median(longest).toFixed(0)}`);
  });

  it('the leader killed while waiters queue: no place outlives its lease, nobody is held up by one', async () => {
    const [holder, waiter, other] = lockers;
    for (let round = 0; round < 4; round++) {
      const keys = Array.from({ length: 6 }, (_, i) => `q${round}-${i}`);
      const held = await Promise.all(keys.map((k) => holder.acquire(k, { ttl: 30_000 })));
      const leader = await cluster.leader();
      try {
        // Waiters join around the kill, each with a short budget: some joins' answers are lost.
        const waiting = [];
        for (let i = 0; i < 24; i++) {
          waiting.push(
            waiter.acquire(keys[i % keys.length], { ttl: 5000, retry: { retries: Infinity, timeout: 1200, delay: 50 } }).then(
              (lock) => lock.release().then(() => null),
              (e) => e,
            ),
          );
          if (i === 6) await leader.stop();
          await sleep(25);
        }
        const outcomes = await Promise.all(waiting);
        const ended = performance.now();
        for (const e of outcomes.filter(Boolean)) {
          assert.ok(e instanceof LockHeldError || e instanceof BackendError, String(e));
        }
        await cluster.leader();
        await Promise.all(held.map((l) => l.release().catch(() => {})));
        // Within a place's lease and a second of the last waiter's end, the queues are empty
        // and the keys free for anyone.
        const left = PLACE_LEASE + 1000 - (performance.now() - ended);
        await emptyWithin(cluster, `fo/\x01q/q${round}-`, Math.max(left, 0), `round ${round}: a queue place`);
        for (const k of keys) {
          const lock = await other.tryAcquire(k, { ttl: 1000 });
          assert.ok(lock, `round ${round}: ${k} is free but refused`);
          await lock.release();
        }
      } finally {
        if (!leader.running()) await leader.start();
        await cluster.leader();
      }
    }
  });

  it('a paused leader: one holder, nothing orphaned, a short wait', async () => {
    await round('pause', async () => {
      const leader = await cluster.leader();
      leader.pause();
      await sleep(2000);
      leader.resume();
      await cluster.leader();
    });
  });

  it('a restarted member (each in turn): one holder, nothing orphaned, a short wait', async () => {
    for (const [i, m] of cluster.members.entries()) {
      await round(`restart${i}`, async () => {
        await m.stop();
        await m.start();
        await cluster.leader();
      });
    }
  });

  it('a session lease the cluster no longer knows: its locks are lost (session), a new session serves', async () => {
    await using adapter = new EtcdAdapter({ endpoints: cluster.endpoints, sessionTtl: 30_000, prefix: 'gone/' });
    await using rival = new EtcdAdapter({ endpoints: cluster.endpoints, prefix: 'gone/' });
    const locker = new Locker({ adapter });
    const held = await locker.acquire('held', { ttl: 60_000 });
    const blocker = await new Locker({ adapter: rival }).acquire('busy', { ttl: 60_000 });
    // A waiter of this adapter queues behind the rival.
    const waiting = locker.acquire('busy', { ttl: 5000, retry: { retries: Infinity, timeout: 10_000, delay: 100 } });
    const places = async () => (await keysUnder(cluster, 'gone/\x01q/busy')).length;
    for (let t = 0; t < 100 && (await places()) !== 1; t++) await sleep(20);
    assert.equal(await places(), 1, 'the waiter has its place');
    const lease = await cluster.call(await cluster.leader(), 'kv/range', { key: b64('gone/held') });
    await cluster.call(await cluster.leader(), 'lease/revoke', { ID: lease.kvs[0].lease });
    // The revoke deletes the waiter's place too: woken, it joins again on the lease that is
    // gone, long before a keep-alive (every 10 s here) could tell.
    await until(() => held.state === 'lost', 3000);
    assert.equal(held.lostReason, 'session');
    const fresh = await locker.acquire('fresh', { ttl: 5000 });
    assert.equal(fresh.state, 'held');
    await blocker.release();
    const got = await waiting;
    assert.equal(got.state, 'held', 'the queued waiter went on with the new session');
    await Promise.all([got.release(), fresh.release()]);
  });
});
