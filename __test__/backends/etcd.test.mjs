// The etcd adapter against real etcd servers: a 3-member cluster (started once for the file)
// whose leader is killed and whose majority is paused, a one-member server whose session lease
// is revoked or outlived, and a server with authentication on.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { BackendError, Locker, ValidationError } from 'locco-rs';
import { EtcdAdapter } from 'locco-rs/etcd';
import { makeTestCertificates, startEtcd, startEtcdCluster, testProxy } from '../support/servers.mjs';
import { heldThroughFlood, sleep, until } from '../support/adapters.mjs';

const b64 = (s) => Buffer.from(s).toString('base64');

/** How many places the queue of `key` under `prefix` has. */
async function queueLength(server, prefix, key) {
  const start = Buffer.from(`${prefix}\x01q/${key}\x00`);
  const end = Buffer.from(start);
  end[end.length - 1] += 1;
  const r = await server.call(server.members[0], 'kv/range', {
    key: start.toString('base64'),
    range_end: end.toString('base64'),
    count_only: true,
  });
  return Number(r.count ?? 0);
}

/** The key as etcd stores it: { value, lease } or null. */
async function readKey(server, member, key) {
  const r = await server.call(member, 'kv/range', { key: b64(key) });
  const kv = r.kvs?.[0];
  return kv ? { value: Buffer.from(kv.value ?? '', 'base64').toString(), lease: kv.lease ?? '0' } : null;
}

describe('EtcdAdapter options', () => {
  const bad = [
    [undefined, 'options'],
    [{}, 'endpoints'],
    [{ endpoints: [] }, 'endpoints'],
    [{ endpoints: ['nohost'] }, 'endpoints[0]'],
    [{ endpoints: ['127.0.0.1:2379', 'http://h:x'] }, 'endpoints[1]'],
    [{ endpoints: ['127.0.0.1:2379'], sessionTtl: 1000 }, 'sessionTtl'],
    [{ endpoints: ['127.0.0.1:2379'], sessionTtl: 2.5 }, 'sessionTtl'],
    [{ endpoints: ['127.0.0.1:2379'], requestTimeout: 0 }, 'requestTimeout'],
    [{ endpoints: ['127.0.0.1:2379'], connectTimeout: '1s' }, 'connectTimeout'],
    [{ endpoints: ['127.0.0.1:2379'], auth: { username: 'u' } }, 'auth.password'],
    [{ endpoints: ['127.0.0.1:2379'], auth: { password: 'p' } }, 'auth.username'],
    [{ endpoints: ['127.0.0.1:2379'], tls: { ca: 'not a pem' } }, 'tls.ca'],
    [{ endpoints: ['https://127.0.0.1:2379'] }, 'tls.ca'],
    [{ endpoints: ['127.0.0.1:2379'], prefix: '' }, 'prefix'],
    [{ endpoints: ['127.0.0.1:2379'], url: 'x' }, 'url'],
  ];
  for (const [options, field] of bad) {
    it(`refuses ${JSON.stringify(options)} naming ${field}`, () => {
      assert.throws(
        () => new EtcdAdapter(options),
        (e) => e instanceof ValidationError && e.field === field,
      );
    });
  }
});

describe('EtcdAdapter on a 3-member cluster', () => {
  let cluster;
  before(async () => {
    cluster = await startEtcdCluster({ size: 3 });
  });
  after(() => cluster.dispose());

  // As on MongoDB: a heartbeat must not wait behind thousands of acquisitions on the I/O
  // thread.
  it('renews a held lock while thousands of acquisitions are in flight', async (t) => {
    await using adapter = new EtcdAdapter({ endpoints: cluster.endpoints, prefix: 'flood/' });
    const seconds = await heldThroughFlood(assert, new Locker({ adapter, retry: { retries: 0 } }), { prefix: 'flood:', count: 8000 });
    t.diagnostic(`flood, 8000 in flight, took ${seconds.toFixed(1)} s`);
  });

  it('stores a lock as its token under the prefix, on one session lease for every lock', async () => {
    await using adapter = new EtcdAdapter({ endpoints: cluster.endpoints, prefix: 'shape/' });
    const locker = new Locker({ adapter });
    const locks = await Promise.all(['a', 'b', 'c'].map((k) => locker.acquire(k, { ttl: 30_000 })));
    const m = cluster.members[0];
    const stored = await Promise.all(['a', 'b', 'c'].map((k) => readKey(cluster, m, `shape/${k}`)));
    stored.forEach((s, i) => assert.equal(s?.value, locks[i].token));
    assert.notEqual(stored[0].lease, '0', 'the key is attached to a lease');
    assert.ok(stored.every((s) => s.lease === stored[0].lease), `one lease for all: ${JSON.stringify(stored)}`);
    await Promise.all(locks.map((l) => l.release()));
    assert.equal(await readKey(cluster, m, 'shape/a'), null, 'a release deletes the key');
  });

  it('gives fencing tokens that grow across keys, adapters and members', async () => {
    await using one = new EtcdAdapter({ endpoints: [cluster.members[0].endpoint], prefix: 'fence/' });
    await using two = new EtcdAdapter({ endpoints: [cluster.members[1].endpoint], prefix: 'fence/' });
    const lockers = [new Locker({ adapter: one, fencing: true }), new Locker({ adapter: two, fencing: true })];
    let last = 0;
    for (let i = 0; i < 6; i++) {
      const lock = await lockers[i % 2].acquire(i % 3 === 0 ? 'same' : `k${i}`, { ttl: 10_000 });
      assert.ok(Number.isSafeInteger(lock.fence) && lock.fence > last, `fence ${lock.fence} after ${last}`);
      last = lock.fence;
      await lock.release();
    }
  });

  it('lets another adapter take a lock whose TTL ran out without an extension', async () => {
    await using one = new EtcdAdapter({ endpoints: [cluster.members[0].endpoint], prefix: 'ttl/' });
    await using two = new EtcdAdapter({ endpoints: [cluster.members[2].endpoint], prefix: 'ttl/' });
    const first = await new Locker({ adapter: one }).acquire('k', { ttl: 300 });
    const other = new Locker({ adapter: two });
    assert.equal(await other.tryAcquire('k', { ttl: 1000 }), null, 'held within its TTL');
    await sleep(500);
    const second = await other.tryAcquire('k', { ttl: 1000 });
    assert.ok(second, 'free after its TTL, though the session lives on');
    assert.notEqual(first.state, 'held');
    await second.release();
  });

  it('wakes a waiter in another process when the key is released or expires, not at its next poll', async () => {
    await using one = new EtcdAdapter({ endpoints: [cluster.members[0].endpoint], prefix: 'wake/' });
    await using two = new EtcdAdapter({ endpoints: [cluster.members[1].endpoint], prefix: 'wake/' });
    const holder = new Locker({ adapter: one });
    const waiter = new Locker({ adapter: two });
    const slow = { retries: 5, delay: 4000 };
    for (const end of ['release', 'expiry']) {
      const held = await holder.acquire(`k-${end}`, { ttl: end === 'expiry' ? 600 : 30_000 });
      const t0 = Date.now();
      const waiting = waiter.acquire(`k-${end}`, { ttl: 5000, retry: slow });
      await sleep(300);
      if (end === 'release') await held.release();
      const lock = await waiting;
      const took = Date.now() - t0;
      assert.ok(took < 2000, `${end}: the waiter took ${took} ms, its poll is 4000 ms`);
      await lock.release();
    }
  });

  it('grants a contended key in order of arrival across adapters, each hand-off pushed', async () => {
    const adapters = [0, 1, 2].map((i) => new EtcdAdapter({ endpoints: [cluster.members[i].endpoint], prefix: 'fair/' }));
    try {
      const lockers = adapters.map((adapter) => new Locker({ adapter }));
      const places = async () => {
        const start = Buffer.from('fair/\x01q/order\x00');
        const end = Buffer.from(start);
        end[end.length - 1] += 1;
        const r = await cluster.call(cluster.members[0], 'kv/range', { key: start.toString('base64'), range_end: end.toString('base64'), count_only: true });
        return Number(r.count ?? 0);
      };
      const holder = await lockers[0].acquire('order', { ttl: 30_000 });
      const slow = { retries: 20, delay: 2000 };
      const order = [];
      const waiting = [];
      // Arrival order: adapter 1, 2, 0, 1.
      for (const [n, i] of [1, 2, 0, 1].entries()) {
        waiting.push(
          lockers[i].acquire('order', { ttl: 30_000, retry: slow }).then(async (lock) => {
            order.push(n);
            await sleep(30);
            await lock.release();
            return performance.now();
          }),
        );
        for (let t = 0; t < 100 && (await places()) !== n + 1; t++) await sleep(20);
        assert.equal(await places(), n + 1, `waiter ${n} has its place`);
      }
      assert.equal(await lockers[2].tryAcquire('order', { ttl: 1000 }), null);
      const released = performance.now();
      await holder.release();
      // A try does not take the key promised to the head.
      assert.equal(await lockers[2].tryAcquire('order', { ttl: 1000 }), null, 'no barging');
      const ends = await Promise.all(waiting);
      assert.deepEqual(order, [0, 1, 2, 3]);
      // Four hand-offs with 30 ms holds: far under one 2000 ms poll.
      assert.ok(Math.max(...ends) - released < 1500, `hand-offs took ${Math.max(...ends) - released} ms`);
      assert.equal(await places(), 0, 'every place left the queue');
    } finally {
      await Promise.all(adapters.map((a) => a.close()));
    }
  });

  it('an aborted waiter leaves the queue at once and holds nobody up', async () => {
    await using one = new EtcdAdapter({ endpoints: [cluster.members[0].endpoint], prefix: 'leave/' });
    await using two = new EtcdAdapter({ endpoints: [cluster.members[1].endpoint], prefix: 'leave/' });
    const [a, b] = [new Locker({ adapter: one }), new Locker({ adapter: two })];
    const holder = await a.acquire('k', { ttl: 30_000 });
    const abort = new AbortController();
    const gone = b.acquire('k', { ttl: 5000, signal: abort.signal, retry: { retries: 50, delay: 2000 } }).catch((e) => e);
    for (let t = 0; t < 100 && (await queueLength(cluster, 'leave/', 'k')) !== 1; t++) await sleep(20);
    assert.equal(await queueLength(cluster, 'leave/', 'k'), 1, 'queued');
    abort.abort();
    await gone;
    for (let t = 0; t < 100 && (await queueLength(cluster, 'leave/', 'k')) !== 0; t++) await sleep(20);
    assert.equal(await queueLength(cluster, 'leave/', 'k'), 0, 'the aborted waiter left');
    await holder.release();
    const next = await b.tryAcquire('k', { ttl: 1000 });
    assert.ok(next, 'a free key with an empty queue goes to a try');
    await next.release();
  });

  it('keeps its locks through the loss of the leader, and grants after the new election', async () => {
    await using adapter = new EtcdAdapter({ endpoints: cluster.endpoints, sessionTtl: 5000, prefix: 'leader/' });
    const locker = new Locker({ adapter });
    const lock = await locker.acquire('held', { ttl: 30_000 });
    const leader = await cluster.leader();
    await leader.stop();
    try {
      const next = await cluster.leader();
      assert.notEqual(next, leader);
      // The session lease lives in the replicated state: the new leader keeps it.
      assert.equal(await lock.isHeld(), true, 'a held lock survives the election');
      assert.equal(lock.state, 'held');
      const fresh = await locker.acquire('after', { ttl: 5000, retry: { retries: 20, delay: 100 } });
      assert.ok(fresh.fence === undefined && fresh.state === 'held');
      assert.equal(await locker.tryAcquire('held', { ttl: 1000 }), null, 'and still excludes others');
      await sleep(2500); // past a third of the session TTL: the keep-alive goes through another member
      assert.equal(lock.state, 'held');
      assert.equal(await lock.release(), true);
      await fresh.release();
    } finally {
      await leader.start();
      await cluster.leader();
    }
  });

  it('never grants, nor answers isHeld, through a member cut off from the majority', async () => {
    const [a, b, c] = cluster.members;
    await using majority = new EtcdAdapter({ endpoints: [a.endpoint, b.endpoint], prefix: 'part/' });
    const held = await new Locker({ adapter: majority }).acquire('held', { ttl: 30_000 });
    await using minority = new EtcdAdapter({ endpoints: [c.endpoint], prefix: 'part/', requestTimeout: 1500 });
    const locker = new Locker({ adapter: minority });
    assert.equal(await minority.isHeld({ key: 'held', token: held.token }), true, 'held, read before the cut');
    a.pause();
    b.pause();
    try {
      // At once, before the member notices it lost its leader: a linearizable read cannot be
      // served from its own copy (a serializable read would answer true from it).
      const read = await minority.isHeld({ key: 'held', token: held.token }).then(
        (v) => v,
        (e) => e,
      );
      assert.ok(read instanceof BackendError, `isHeld on the minority: ${String(read)}`);
      for (const key of ['free', 'held']) {
        const got = await locker.tryAcquire(key, { ttl: 5000 }).then(
          (lock) => ({ lock }),
          (error) => ({ error }),
        );
        assert.equal(got.lock, undefined, `no grant of ${key} from the minority`);
        assert.ok(got.error instanceof BackendError, String(got.error));
      }
    } finally {
      a.resume();
      b.resume();
    }
    await cluster.leader();
    // The healed member learns of the leader a heartbeat later; until then it refuses.
    for (let t = 0; t < 100; t++) {
      const status = await cluster.call(c, 'maintenance/status').catch(() => ({}));
      if (status.leader && status.leader !== '0') break;
      await sleep(50);
    }
    const lock = await locker.acquire('free', { ttl: 5000, retry: { retries: 30, delay: 100 } });
    assert.equal(lock.state, 'held', 'grants again once the partition heals');
    await lock.release();
    await held.release();
  });
});

describe('EtcdAdapter session lease', () => {
  let etcd;
  before(async () => {
    etcd = await startEtcd();
  });
  after(() => etcd.dispose());

  it('an attempt given up while its adapter still connects sends nothing, so no grant lands after its give-back', async () => {
    // The first connection takes 1.5 s, the lease 1 s: the engine gives the attempt up while
    // the session is still being opened. Any grant that went out after that would move the
    // store's revision (its put, then the give-back's delete); a lease grant does not.
    const revision = async () => (await etcd.call(etcd.members[0], 'kv/range', { key: b64('x'), count_only: true })).header.revision;
    const proxy = await testProxy(Number(etcd.endpoint.split(':').pop()), { delay: 1500 });
    try {
      await using adapter = new EtcdAdapter({ endpoints: [`127.0.0.1:${proxy.port}`], prefix: 'late/' });
      const before = await revision();
      const locker = new Locker({ adapter, retry: { retries: 0 } });
      const err = await locker.tryAcquire('k', { ttl: 1000 }).catch((e) => e);
      assert.ok(err instanceof BackendError && err.kind === 'timeout', String(err));
      await sleep(2500); // the connection, the give-back, and anything else still due
      assert.equal(await revision(), before, 'no write reached the server');
      assert.equal(await readKey(etcd, etcd.members[0], 'late/k'), null);
    } finally {
      await proxy.close();
    }
  });

  it('a grant that could not connect is not sent again once the engine gave it up', async () => {
    // Connected, then the network is cut for 1.5 s against a 1 s lease: the grant cannot
    // leave and is retried until requestTimeout, but a retry after the engine gave it up
    // would land after the give-back. Any grant that lands moves the store's revision.
    const revision = async () => (await etcd.call(etcd.members[0], 'kv/range', { key: b64('x'), count_only: true })).header.revision;
    const proxy = await testProxy(Number(etcd.endpoint.split(':').pop()));
    try {
      await using adapter = new EtcdAdapter({ endpoints: [`127.0.0.1:${proxy.port}`], prefix: 'resent/' });
      const locker = new Locker({ adapter, retry: { retries: 0 } });
      const first = await locker.acquire('warm', { ttl: 60_000 });
      await first.release();
      const before = await revision();
      await proxy.cut();
      await sleep(200); // the client has seen its connection close: the grant never leaves
      setTimeout(() => proxy.restore(), 1500);
      const err = await locker.tryAcquire('k', { ttl: 1000 }).catch((e) => e);
      assert.ok(err instanceof BackendError && err.kind === 'timeout', String(err));
      await sleep(2500); // the way back, the give-back, and anything else still due
      // The only write since: the attempt's refusal mark, which fences off any copy of it.
      const prefix = Buffer.from('resent/');
      const end = Buffer.from(prefix);
      end[end.length - 1] += 1;
      const written = await etcd.call(etcd.members[0], 'kv/range', {
        key: prefix.toString('base64'),
        range_end: end.toString('base64'),
        min_mod_revision: String(Number(before) + 1),
      });
      const names = (written.kvs ?? []).map((kv) => Buffer.from(kv.key, 'base64').toString());
      assert.ok(names.every((n) => n.startsWith('resent/\x01x/')), `written since: ${JSON.stringify(names)}`);
      assert.ok(Number(await revision()) - Number(before) <= 1, 'no write but the refusal mark reached the server');
      assert.equal(await readKey(etcd, etcd.members[0], 'resent/k'), null);
    } finally {
      await proxy.close();
    }
  });

  it('marks every lock lost with reason session when its lease is revoked', async () => {
    await using adapter = new EtcdAdapter({ endpoints: [etcd.endpoint], sessionTtl: 3000, prefix: 'revoke/' });
    const locker = new Locker({ adapter });
    const locks = await Promise.all(['a', 'b'].map((k) => locker.acquire(k, { ttl: 60_000 })));
    const stored = await readKey(etcd, etcd.members[0], 'revoke/a');
    await etcd.call(etcd.members[0], 'lease/revoke', { ID: stored.lease });
    await until(() => locks.every((l) => l.state === 'lost'), 3000);
    assert.deepEqual(locks.map((l) => l.lostReason), ['session', 'session']);
    // A new session serves the next grant.
    const again = await locker.acquire('a', { ttl: 5000 });
    assert.equal(again.state, 'held');
    assert.notEqual((await readKey(etcd, etcd.members[0], 'revoke/a')).lease, stored.lease);
    await again.release();
  });

  it('marks its locks lost with reason session when the server is unreachable past the lease TTL', async () => {
    await using adapter = new EtcdAdapter({ endpoints: [etcd.endpoint], sessionTtl: 2000, prefix: 'pause/' });
    const locker = new Locker({ adapter });
    const lock = await locker.acquire('k', { ttl: 60_000 });
    const t0 = Date.now();
    etcd.pause();
    try {
      await until(() => lock.state === 'lost', 4000);
      assert.equal(lock.lostReason, 'session');
      assert.ok(Date.now() - t0 <= 2500, `lost within the session TTL, took ${Date.now() - t0} ms`);
    } finally {
      etcd.resume();
    }
    const again = await locker.acquire('k', { ttl: 5000, retry: { retries: 30, delay: 200 } });
    assert.equal(again.state, 'held', 'the old key went with its lease; a new session grants');
    await again.release();
  });
});

describe('EtcdAdapter operator verbs', () => {
  let etcd;
  before(async () => {
    etcd = await startEtcd();
  });
  after(() => etcd.dispose());

  it('never lists, inspects as held, or deletes a key that is not a lock', async () => {
    const m = etcd.members[0];
    await using adapter = new EtcdAdapter({ endpoints: [etcd.endpoint], prefix: 'ops/' });
    const locker = new Locker({ adapter });
    const lock = await locker.acquire('job', { ttl: 30_000, holder: 'worker-1' });
    // An application's own keys under the prefix (no lease: this library writes every lock on
    // one), one beside it, and a waiter's queue place.
    await etcd.call(m, 'kv/put', { key: b64('ops/user:42:profile'), value: b64('precious') });
    await etcd.call(m, 'kv/put', { key: b64('opsX'), value: b64('outside') });
    const { ID } = await etcd.call(m, 'lease/grant', { TTL: 60 });
    await etcd.call(m, 'kv/put', { key: b64('ops/\x01q/job'), value: b64('w1'), lease: ID });
    const listed = (await locker.list()).map((i) => i.key);
    assert.deepEqual(listed, ['job']);
    for (const key of ['user:42:profile', '\x01q/job']) {
      const info = await locker.inspect(key);
      assert.equal(info.held, false, `inspect(${JSON.stringify(key)})`);
      assert.equal(await locker.forceRelease(key), false, `forceRelease(${JSON.stringify(key)})`);
    }
    assert.equal((await readKey(etcd, m, 'ops/user:42:profile'))?.value, 'precious', 'the application key is left alone');
    assert.equal((await readKey(etcd, m, 'ops/\x01q/job'))?.value, 'w1', 'the queue place is left alone');
    assert.equal((await readKey(etcd, m, 'opsX'))?.value, 'outside');
    // The lock itself: seen, and removed.
    const info = await locker.inspect('job');
    assert.equal(info.held, true);
    assert.equal(info.holder, 'worker-1');
    assert.equal(await locker.forceRelease('job'), true);
    assert.equal(await readKey(etcd, m, 'ops/job'), null);
    assert.equal(await lock.isHeld(), false);
  });
});

describe('EtcdAdapter session end', () => {
  let etcd;
  before(async () => {
    etcd = await startEtcd();
  });
  after(() => etcd.dispose());

  it('reports a lock lost no later than its session can end when the cluster cannot be reached', async () => {
    // The session opens with the first grant and is cut off before its first keep-alive: it
    // can end as early as the grant's send time plus the TTL less 1%, so its locks must read
    // lost by then (the cluster would drop their keys right after).
    const late = [];
    for (let round = 0; round < 3; round++) {
      const proxy = await testProxy(Number(etcd.endpoint.split(':').pop()));
      try {
        await using adapter = new EtcdAdapter({ endpoints: [`127.0.0.1:${proxy.port}`], sessionTtl: 2000, prefix: `end${round}/` });
        let lostAt;
        const locker = new Locker({ adapter, onEvent: (e) => e.type === 'lost' && (lostAt ??= performance.now()) });
        const lock = await locker.acquire('k', { ttl: 60_000 });
        const granted = performance.now();
        await proxy.cut();
        await until(() => lostAt !== undefined, 4000);
        assert.equal(lock.lostReason, 'session');
        late.push(lostAt - (granted + 1980));
      } finally {
        await proxy.close();
      }
    }
    // A few ms for the news to reach the JavaScript thread; a keep-alive loop that only looks
    // every 100 ms is later than that.
    assert.ok(Math.max(...late) < 15, `lost after the session's end by ${late.map((x) => x.toFixed(0)).join(', ')} ms`);
  });

  it('a lock reads lost at once when the event loop was blocked past its session\'s end', async () => {
    // No news can reach a blocked JavaScript thread: the first read after it must still say
    // lost, from the session's end on the clock, before the cluster's keys are taken by others.
    const proxy = await testProxy(Number(etcd.endpoint.split(':').pop()));
    try {
      await using adapter = new EtcdAdapter({ endpoints: [`127.0.0.1:${proxy.port}`], sessionTtl: 2000, prefix: 'blocked/' });
      const locker = new Locker({ adapter });
      const lock = await locker.acquire('k', { ttl: 60_000 });
      await proxy.cut();
      const until = performance.now() + 2500;
      while (performance.now() < until); // the event loop is blocked past the session's end
      assert.equal(lock.state, 'lost');
      assert.equal(lock.lostReason, 'session');
      assert.equal(lock.signal.aborted, true);
    } finally {
      await proxy.close();
    }
  });
});

describe('EtcdAdapter with authentication', () => {
  let etcd;
  const password = 'pw-s3cret-etcd';
  before(async () => {
    etcd = await startEtcd();
    const m = etcd.members[0];
    await etcd.call(m, 'auth/role/add', { name: 'root' });
    await etcd.call(m, 'auth/user/add', { name: 'root', password });
    await etcd.call(m, 'auth/user/grant', { user: 'root', role: 'root' });
    await etcd.call(m, 'auth/enable', {});
  });
  after(() => etcd.dispose());

  it('locks with the right user and password', async () => {
    await using adapter = new EtcdAdapter({ endpoints: [etcd.endpoint], auth: { username: 'root', password } });
    const lock = await new Locker({ adapter }).acquire('k', { ttl: 5000 });
    assert.equal(await lock.isHeld(), true);
    assert.equal(await lock.release(), true);
  });

  it('fails with an auth BackendError, not contention, and never shows the password', async () => {
    await using adapter = new EtcdAdapter({ endpoints: [etcd.endpoint], auth: { username: 'root', password: 'wrong-password' } });
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 5000 }).catch((e) => e);
    assert.ok(err instanceof BackendError, String(err));
    assert.equal(err.kind, 'auth', err.message);
    assert.equal(err.backend, 'etcd');
    assert.ok(!err.message.includes('wrong-password'));
  });

  it('fails without credentials', async () => {
    await using adapter = new EtcdAdapter({ endpoints: [etcd.endpoint] });
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 5000 }).catch((e) => e);
    assert.ok(err instanceof BackendError, String(err));
    assert.equal(err.kind, 'auth', err.message);
  });
});

describe('EtcdAdapter over TLS', () => {
  let etcd;
  let certs;
  before(async () => {
    certs = makeTestCertificates();
    etcd = await startEtcd({ tls: certs });
  });
  after(() => etcd.dispose());

  it('locks over https with the CA given in tls.ca', async () => {
    await using adapter = new EtcdAdapter({ endpoints: [etcd.tlsEndpoint], tls: { ca: certs.ca } });
    const lock = await new Locker({ adapter, fencing: true }).acquire('k', { ttl: 5000 });
    assert.ok(lock.fence > 0);
    assert.equal(await lock.release(), true);
  });

  it('refuses a server its CA did not sign with a BackendError', async () => {
    const other = makeTestCertificates();
    await using adapter = new EtcdAdapter({ endpoints: [etcd.tlsEndpoint], tls: { ca: other.ca }, requestTimeout: 2000 });
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 5000 }).catch((e) => e);
    assert.ok(err instanceof BackendError, String(err));
    assert.equal(err.kind, 'tls', err.message);
  });
});
