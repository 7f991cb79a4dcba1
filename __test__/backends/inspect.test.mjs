// Holder labels and the operator calls (locker.inspect, list, forceRelease) on every built-in
// backend, against real servers started here. Two adapters on one server stand for two
// processes: the rival never shares the holder's adapter, so nothing is answered from memory.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Locker, LockHeldError, LockLostError, ValidationError } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { RedisAdapter, RedlockAdapter } from 'locco-rs/redis';
import { PostgresAdapter } from 'locco-rs/postgres';
import { MongoAdapter } from 'locco-rs/mongo';
import { EtcdAdapter } from 'locco-rs/etcd';
import { startEtcd, startMongo, startPostgres, startRedis, startRedisCluster } from '../support/servers.mjs';
import { MapAdapter } from '../support/map-adapter.mjs';
import { sleep } from '../support/adapters.mjs';

let n = 0;
const unique = (name) => `insp:${process.pid}:${++n}:${name}`;
const quick = { retries: 2, delay: 20 };

// What each backend can tell: `fence` when it keeps a fencing token per key (`keptFence` when
// the key's last one stays after a release), `foreignTtl` when a process that does not hold the
// lock still learns its time left.
const servers = {};
const backends = [
  {
    name: 'memory',
    fence: true,
    keptFence: true,
    foreignTtl: true,
    // One adapter is one process's memory: both Lockers share it.
    pair: () => {
      const a = new InMemoryAdapter();
      return [a, a];
    },
  },
  { name: 'Redis', fence: true, keptFence: true, foreignTtl: true, pair: () => [0, 1].map(() => new RedisAdapter({ url: servers.redis.url })) },
  {
    name: 'Redis Cluster',
    fence: true,
    keptFence: true,
    foreignTtl: true,
    pair: () => [0, 1].map(() => new RedisAdapter({ urls: servers.cluster.map((s) => s.url), cluster: true })),
  },
  { name: 'PostgreSQL', fence: false, foreignTtl: true, pair: () => [0, 1].map(() => new PostgresAdapter({ url: servers.postgres.url })) },
  {
    name: 'MongoDB',
    fence: true,
    keptFence: true,
    foreignTtl: true,
    pair: () => [0, 1].map(() => new MongoAdapter({ url: servers.mongo.url, dbName: 'inspect' })),
  },
  { name: 'etcd', fence: true, foreignTtl: false, pair: () => [0, 1].map(() => new EtcdAdapter({ endpoints: [servers.etcd.endpoint] })) },
];

before(async () => {
  servers.redis = await startRedis();
  servers.postgres = await startPostgres();
  servers.mongo = await startMongo();
  servers.etcd = await startEtcd();
  servers.redlock = await Promise.all([1, 2, 3].map(() => startRedis()));
  servers.cluster = (await startRedisCluster()).nodes;
});

after(async () => {
  const all = [servers.redis, servers.postgres, servers.mongo, servers.etcd, ...(servers.redlock ?? []), ...(servers.cluster ?? [])];
  await Promise.all(all.filter(Boolean).map((s) => s.dispose()));
});

for (const b of backends) {
  describe(`holder and inspection on ${b.name}`, () => {
    let adapters;
    let holder;
    let rival;
    before(() => {
      adapters = b.pair();
      holder = new Locker({ adapter: adapters[0], fencing: true });
      rival = new Locker({ adapter: adapters[1] });
    });
    after(async () => {
      await holder.close();
      await rival.close();
      for (const a of new Set(adapters)) await a.close?.();
    });

    it("names the holder in a rival's LockHeldError, from acquire, withLock and acquireMany", async () => {
      const key = unique('held');
      const lock = await holder.acquire(key, { ttl: 10_000, holder: 'worker-a (pid 41)' });
      const e = await rival.acquire(key, { ttl: 1000, retry: quick }).catch((x) => x);
      assert.ok(e instanceof LockHeldError, String(e));
      assert.equal(e.holder, 'worker-a (pid 41)');
      assert.match(e.message, /held by "worker-a \(pid 41\)"/);
      const w = await rival.withLock(key, { ttl: 1000, retry: { retries: 0 } }, () => 'ran').catch((x) => x);
      assert.equal(w.holder, 'worker-a (pid 41)');
      const m = await rival.acquireMany([unique('free'), key], { ttl: 1000, retry: { retries: 0 } }).catch((x) => x);
      assert.ok(m instanceof LockHeldError);
      assert.equal(m.holder, 'worker-a (pid 41)');
      assert.equal(await rival.tryAcquire(key, { ttl: 1000 }), null);
      await lock.release();
      // A key held without a label: the error says so by leaving holder undefined.
      const plain = await holder.acquire(key, { ttl: 10_000 });
      const e2 = await rival.acquire(key, { ttl: 1000, retry: { retries: 0 } }).catch((x) => x);
      assert.ok(e2 instanceof LockHeldError);
      assert.equal(e2.holder, undefined);
      assert.match(e2.message, /held elsewhere/);
      await plain.release();
    });

    it('inspects a held key (time left, fence, holder, never the token), a free key and an expired one', async () => {
      const key = unique('inspect');
      assert.deepEqual(await rival.inspect(key), { held: false });
      const lock = await holder.acquire(key, { ttl: 5000, holder: 'job 7' });
      const seen = await rival.inspect(key);
      assert.equal(seen.held, true);
      assert.equal(seen.holder, 'job 7');
      assert.ok(!JSON.stringify(seen).includes(lock.token.split('|')[0]), 'the token must not show');
      if (b.foreignTtl) assert.ok(seen.ttlLeft > 3000 && seen.ttlLeft <= 5000, `ttlLeft ${seen.ttlLeft}`);
      const own = await holder.inspect(key);
      assert.ok(own.ttlLeft > 3000 && own.ttlLeft <= 5000, `the holder's own ttlLeft ${own.ttlLeft}`);
      if (b.fence) assert.equal(seen.fence, lock.fence);
      else assert.equal(seen.fence, undefined);
      await lock.release();
      const free = await rival.inspect(key);
      assert.equal(free.held, false);
      assert.equal(free.holder, undefined);
      assert.equal(free.ttlLeft, undefined);
      // The last fence stays with the key after the release, where the backend keeps one (etcd's
      // fence is the holding key's create revision: a free key has none).
      if (b.keptFence) assert.equal(free.fence, lock.fence);
      else assert.equal(free.fence, undefined);
      const short = await holder.acquire(key, { ttl: 150, holder: 'short' });
      await sleep(400);
      assert.equal((await rival.inspect(key)).held, false);
      assert.equal(short.state, 'lost');
    });

    it('lists the held keys under a prefix, with their holders, in key order', async () => {
      const prefix = unique('list:');
      const a = await holder.acquire(`${prefix}a`, { ttl: 10_000, holder: 'A' });
      const c = await rival.acquire(`${prefix}c`, { ttl: 10_000 });
      const gone = await holder.acquire(`${prefix}b`, { ttl: 10_000, holder: 'B' });
      await gone.release();
      const other = await holder.acquire(unique('elsewhere'), { ttl: 10_000, holder: 'X' });
      const listed = await rival.list({ prefix });
      assert.deepEqual(
        listed.map((k) => [k.key, k.held, k.holder]),
        [
          [`${prefix}a`, true, 'A'],
          [`${prefix}c`, true, undefined],
        ],
      );
      if (b.fence) assert.equal(listed[0].fence, a.fence);
      if (b.foreignTtl) assert.ok(listed.every((k) => k.ttlLeft > 5000 && k.ttlLeft <= 10_000));
      assert.equal((await rival.list({ prefix, limit: 1 })).length, 1);
      assert.equal((await rival.list({ prefix: `${prefix}zzz` })).length, 0);
      for (const l of [a, c, other]) await l.release();
    });

    it('forceRelease frees a held key whatever its token; the holder learns it at its next extend', async () => {
      const key = unique('force');
      const lock = await holder.acquire(key, { ttl: 10_000, holder: 'stuck worker' });
      assert.equal(await rival.forceRelease(key), true);
      assert.equal((await rival.inspect(key)).held, false);
      const next = await rival.acquire(key, { ttl: 10_000, holder: 'next' });
      const e = await lock.extend(10_000).catch((x) => x);
      assert.ok(e instanceof LockLostError, String(e));
      assert.equal(lock.state, 'lost');
      assert.equal(await lock.isHeld(), false);
      assert.equal(await lock.release(), false);
      assert.equal(await next.isHeld(), true, "the old holder's release must not touch the new lock");
      assert.equal(await rival.forceRelease(unique('never-held')), false);
      await next.release();
      assert.equal(await rival.forceRelease(key), false);
    });

    it('a waiter queued for a key force-released gets it, and the holder still shows while it waits', async () => {
      const key = unique('queued');
      const lock = await holder.acquire(key, { ttl: 20_000, holder: 'long job' });
      const waiting = rival.acquire(key, { ttl: 5000, retry: { retries: Infinity, delay: 100, timeout: 10_000 } });
      await sleep(300);
      // On Redis the key now carries the queue's mark after the label: the label still reads.
      assert.equal((await rival.inspect(key)).holder, 'long job');
      assert.equal(await holder.forceRelease(key), true);
      const won = await waiting;
      assert.equal(await won.isHeld(), true);
      await won.release();
      await lock.release();
    });

    it('a value stored without a label (an older version) is inspected, released and force-released', async () => {
      const adapter = adapters[0];
      const key = unique('old');
      assert.equal(await adapter.acquire({ key, token: 'old-token-1', ttl: 10_000 }), true);
      const seen = await rival.inspect(key);
      assert.equal(seen.held, true);
      assert.equal(seen.holder, undefined);
      assert.equal(await adapter.release({ key, token: 'old-token-1' }), true);
      assert.equal(await adapter.acquire({ key, token: 'old-token-2', ttl: 10_000 }), true);
      assert.deepEqual((await rival.list({ prefix: key })).map((k) => [k.key, k.holder]), [[key, undefined]]);
      assert.equal(await rival.forceRelease(key), true);
      assert.equal(await adapter.isHeld({ key, token: 'old-token-2' }), false);
      // And a labelled lock's release compares the whole stored value, as before.
      const lock = await holder.acquire(key, { ttl: 10_000, holder: 'new' });
      assert.equal(await adapter.release({ key, token: lock.token.split('|')[0] }), false);
      assert.equal(await lock.release(), true);
    });
  });
}

describe('holder validation', () => {
  const locker = new Locker({ adapter: new InMemoryAdapter() });
  const bad = [
    [42, /must be a string/],
    ['', /non-empty/],
    ['x'.repeat(257), /256/],
    ['é'.repeat(129), /258 bytes/],
    ['a|b', /'\|'/],
    ['line\nbreak', /\\n/],
    ['nul\u0000', /\\0/],
  ];
  for (const [holder, message] of bad) {
    it(`refuses holder ${JSON.stringify(holder).slice(0, 20)} on every acquisition call`, async () => {
      const calls = [
        () => locker.acquire('v', { ttl: 1000, holder }),
        () => locker.tryAcquire('v', { ttl: 1000, holder }),
        () => locker.acquireMany(['v', 'w'], { ttl: 1000, holder }),
        () => locker.withLock('v', { ttl: 1000, holder }, () => {}),
      ];
      for (const call of calls) {
        const e = await call().catch((x) => x);
        assert.ok(e instanceof ValidationError, String(e));
        assert.equal(e.field, 'holder');
        assert.match(e.message, message);
      }
    });
  }
  it('takes a label of 256 bytes, and any other text', async () => {
    for (const holder of ['x'.repeat(256), 'worker ✓ (pid 1)', 'api-7f9c']) {
      const lock = await locker.acquire(unique('ok'), { ttl: 1000, holder });
      assert.equal((await locker.inspect(lock.key)).holder, holder);
      await lock.release();
    }
  });
});

describe('operator calls on backends that cannot answer them', () => {
  it('PostgreSQL advisory mode: the holding session is named after the holder; inspect tells held and holder; list and forceRelease are refused', async () => {
    const adapters = [0, 1].map(() => new PostgresAdapter({ url: servers.postgres.url, mode: 'advisory', poolSize: 2 }));
    const [holder, rival] = adapters.map((adapter) => new Locker({ adapter }));
    try {
      const key = unique('advisory');
      assert.deepEqual(await rival.inspect(key), { held: false });
      const lock = await holder.acquire(key, { ttl: 10_000, holder: 'advisory worker' });
      const e = await rival.acquire(key, { ttl: 1000, retry: { retries: 0 } }).catch((x) => x);
      assert.ok(e instanceof LockHeldError, String(e));
      assert.equal(e.holder, 'advisory worker');
      assert.deepEqual(await rival.inspect(key), { held: true, holder: 'advisory worker' });
      assert.equal(await lock.release(), true);
      assert.deepEqual(await rival.inspect(key), { held: false });
      // The session went back to the pool without its name: the next lock on it shows none.
      const unnamed = await holder.acquire(unique('advisory-2'), { ttl: 10_000 });
      assert.deepEqual(await rival.inspect(unnamed.key), { held: true });
      await unnamed.release();
      // A label longer than a session name is cut to fit (63 bytes with its 'locco:').
      const long = await holder.acquire(key, { ttl: 10_000, holder: 'x'.repeat(100) });
      assert.equal((await rival.inspect(key)).holder, 'x'.repeat(57));
      await long.release();
      for (const call of [() => rival.list(), () => rival.forceRelease(key)]) {
        const err = await call().catch((x) => x);
        assert.ok(err instanceof ValidationError, String(err));
        assert.match(err.message, /advisory mode/);
      }
    } finally {
      await holder.close();
      await rival.close();
      for (const a of adapters) await a.close();
    }
  });

  it('a JavaScript adapter without inspect makes the calls reject, naming the method to add', async () => {
    const locker = new Locker({ adapter: new MapAdapter() });
    for (const [call, method] of [
      [() => locker.inspect('k'), 'inspect'],
      [() => locker.list(), 'list'],
      [() => locker.forceRelease('k'), 'forceRelease'],
    ]) {
      const e = await call().catch((x) => x);
      assert.ok(e instanceof ValidationError, String(e));
      assert.match(e.message, new RegExp(`no ${method} method: add ${method}\\(`));
    }
  });

  it("a JavaScript adapter's inspect, list and forceRelease answer for the Locker, with its keyPrefix", async () => {
    const seen = [];
    const adapter = Object.assign(new MapAdapter(), {
      async inspect({ key }) {
        seen.push(['inspect', key]);
        return { held: true, ttlLeft: 12, holder: 'js', token: 'never shown' };
      },
      async list({ prefix, limit }) {
        seen.push(['list', prefix, limit]);
        return [{ key: 'app:a', held: true, fence: 3 }];
      },
      async forceRelease({ key }) {
        seen.push(['forceRelease', key]);
        return true;
      },
    });
    const locker = new Locker({ adapter, keyPrefix: 'app:' });
    assert.deepEqual(await locker.inspect('k'), { held: true, ttlLeft: 12, holder: 'js' });
    assert.deepEqual(await locker.list({ prefix: 'a' }), [{ key: 'a', held: true, fence: 3 }]);
    assert.equal(await locker.forceRelease('k'), true);
    assert.deepEqual(seen, [
      ['inspect', 'app:k'],
      ['list', 'app:a', 1000],
      ['forceRelease', 'app:k'],
    ]);
  });

  it("a JavaScript adapter's inspect names the holder in a LockHeldError; without one the holder stays unknown", async () => {
    const labelled = Object.assign(new MapAdapter(), {
      async inspect() {
        return { held: true, holder: 'js holder' };
      },
    });
    for (const [adapter, expected] of [
      [labelled, 'js holder'],
      [new MapAdapter(), undefined],
    ]) {
      const locker = new Locker({ adapter });
      await locker.acquire('k', { ttl: 5000, holder: 'js holder' });
      const e = await locker.acquire('k', { ttl: 1000, retry: { retries: 0 } }).catch((x) => x);
      assert.ok(e instanceof LockHeldError, String(e));
      assert.equal(e.holder, expected);
      const m = await locker.acquireMany(['j', 'k'], { ttl: 1000, retry: { retries: 0 } }).catch((x) => x);
      assert.equal(m.holder, expected);
      if (expected) assert.match(e.message, /held by "js holder"/);
    }
  });

  it("a JavaScript adapter's inspect that never answers holds the LockHeldError back by 250 ms at most", async () => {
    const adapter = Object.assign(new MapAdapter(), { inspect: () => new Promise(() => {}) });
    const locker = new Locker({ adapter });
    await locker.acquire('k', { ttl: 5000 });
    const started = performance.now();
    const e = await locker.acquire('k', { ttl: 1000, retry: { retries: 0 } }).catch((x) => x);
    const took = performance.now() - started;
    assert.ok(e instanceof LockHeldError, String(e));
    assert.equal(e.holder, undefined);
    assert.ok(took >= 240 && took < 1000, `took ${took}`);
  });

  it('the keyPrefix applies to built-in adapters too, and list answers keys without it', async () => {
    const adapter = new InMemoryAdapter();
    const app = new Locker({ adapter, keyPrefix: 'app:' });
    const raw = new Locker({ adapter });
    const lock = await app.acquire('k', { ttl: 1000, holder: 'h' });
    assert.equal((await raw.inspect('app:k')).holder, 'h');
    assert.deepEqual((await app.list()).map((k) => k.key), ['k']);
    assert.deepEqual((await raw.list()).map((k) => k.key), ['app:k']);
    assert.equal(await app.forceRelease('k'), true);
    assert.equal(await lock.isHeld(), false);
  });
});

describe('Redis hot path', () => {
  it('an uncontended acquire stays one SET NX, with or without holder; without it the value is the bare token', async () => {
    const adapter = new RedisAdapter({ url: servers.redis.url });
    const locker = new Locker({ adapter });
    try {
      await (await locker.acquire(unique('warm-up'), { ttl: 1000 })).release();
      const commands = () =>
        Object.fromEntries(
          servers.redis
            .cli('INFO', 'commandstats')
            .split('\n')
            .map((l) => /^cmdstat_([^:]+):calls=(\d+)/.exec(l.trim()))
            .filter(Boolean)
            .map((m) => [m[1], Number(m[2])])
            .filter(([name]) => name !== 'info' && name !== 'config|resetstat'),
        );
      for (const holder of [undefined, 'worker-9']) {
        servers.redis.cli('CONFIG', 'RESETSTAT');
        const key = unique('hot');
        const lock = await locker.acquire(key, holder === undefined ? { ttl: 5000 } : { ttl: 5000, holder });
        assert.deepEqual(commands(), { set: 1 }, `holder ${holder}`);
        const stored = servers.redis.cli('GET', key);
        assert.equal(stored, lock.token);
        if (holder === undefined) assert.doesNotMatch(stored, /locco:holder/);
        else assert.ok(stored.endsWith(`|locco:holder=${holder}`), stored);
        await lock.release();
      }
    } finally {
      await locker.close();
      await adapter.close();
    }
  });
});

describe('Redis Cluster listing', () => {
  it('walks every master, and a stray key with } outside a hash tag does not break it', async () => {
    const adapter = new RedisAdapter({ urls: servers.cluster.map((s) => s.url), cluster: true });
    const locker = new Locker({ adapter });
    try {
      const prefix = unique('spread:');
      const locks = [];
      for (let i = 0; i < 12; i++) locks.push(await locker.acquire(`${prefix}${i}`, { ttl: 10_000, holder: `h${i}` }));
      const owners = new Set(locks.map((l) => servers.cluster.findIndex((s) => s.cli('EXISTS', l.key) === '1')));
      assert.ok(owners.size > 1, 'the keys should live on several masters');
      servers.cluster[0].cli('-c', 'SET', `${prefix}odd}key`, 'not a lock', 'PX', '10000');
      const listed = await locker.list({ prefix });
      const expected = locks.map((l) => l.key);
      assert.deepEqual(
        listed.map((k) => k.key).filter((k) => !k.includes('}')),
        [...expected].sort(),
      );
      assert.equal(listed.find((k) => k.key === `${prefix}3`).holder, 'h3');
      for (const l of locks) await l.release();
    } finally {
      await locker.close();
      await adapter.close();
    }
  });
});

describe('Redlock', () => {
  it('shows the holder held on a majority, lists and force-releases on every server', async () => {
    const urls = servers.redlock.map((s) => s.url);
    const a = new RedlockAdapter({ urls });
    const b = new RedlockAdapter({ urls });
    const holder = new Locker({ adapter: a });
    const rival = new Locker({ adapter: b });
    try {
      const key = unique('redlock');
      const lock = await holder.acquire(key, { ttl: 10_000, holder: 'quorum' });
      const e = await rival.acquire(key, { ttl: 1000, retry: { retries: 0 } }).catch((x) => x);
      assert.equal(e.holder, 'quorum');
      const seen = await rival.inspect(key);
      assert.equal(seen.held, true);
      assert.equal(seen.holder, 'quorum');
      // The servers are asked for the ttl plus Redlock's drift allowance (1% + 2 ms).
      assert.ok(seen.ttlLeft > 5000 && seen.ttlLeft <= 10_102, `ttlLeft ${seen.ttlLeft}`);
      assert.deepEqual((await rival.list({ prefix: key })).map((k) => [k.key, k.holder]), [[key, 'quorum']]);
      assert.equal(await rival.forceRelease(key), true);
      assert.equal((await rival.inspect(key)).held, false);
      assert.ok((await lock.extend(10_000).catch((x) => x)) instanceof LockLostError);
      // A key on one server of three is no lock: not held, not listed.
      const minority = unique('redlock-minority');
      servers.redlock[0].cli('SET', minority, 'tok|locco:holder=alone', 'PX', '10000');
      assert.deepEqual(await rival.inspect(minority), { held: false });
      assert.deepEqual(await rival.list({ prefix: minority }), []);
    } finally {
      await holder.close();
      await rival.close();
      await a.close();
      await b.close();
    }
  });
});
