import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MongoClient, Timestamp } from 'mongodb';
import { setTimeout as sleep } from 'node:timers/promises';
import { BackendError, Locker, ValidationError } from 'locco-rs';
import { MongoAdapter, mongoLocksIndexes } from 'locco-rs/mongo';
import { testProxy, freePort, startMongo } from '../support/servers.mjs';
import { heldThroughFlood, heldThroughRestart } from '../support/adapters.mjs';

describe('MongoAdapter', () => {
  let mongo;
  let client;
  before(async () => {
    mongo = await startMongo();
    client = new MongoClient(mongo.url);
    await client.connect();
  });
  after(async () => {
    await client.close();
    await mongo.dispose();
  });

  it('refuses to run without the unique index on key, and runs once it exists', async () => {
    const db = client.db('no_index');
    await db.createCollection('locks');
    const adapter = new MongoAdapter({ url: mongo.url, dbName: 'no_index', collectionName: 'locks', createIndexes: false });
    const locker = new Locker({ adapter });
    const err = await locker.tryAcquire('k', { ttl: 1000 }).catch((e) => e);
    assert.ok(err instanceof ValidationError, String(err));
    assert.match(err.message, /no unique index on key/);
    // The migration path: the indexes from mongoLocksIndexes(), created by the user.
    await db.collection('locks').createIndexes(mongoLocksIndexes());
    const lock = await locker.tryAcquire('k', { ttl: 1000 });
    assert.notEqual(lock, null);
    assert.equal(await lock.release(), true);
  });

  // The I/O thread takes the requests sent to it in order: a heartbeat sent behind thousands
  // of acquisitions started seconds later, after its lock's lease had run out.
  it('renews a held lock while thousands of acquisitions are in flight', async (t) => {
    const adapter = new MongoAdapter({ url: mongo.url, dbName: 'flood' });
    try {
      const seconds = await heldThroughFlood(assert, new Locker({ adapter, retry: { retries: 0 } }), { prefix: 'flood:', count: 8000 });
      t.diagnostic(`flood, 8000 in flight, took ${seconds.toFixed(1)} s`);
    } finally {
      await adapter.close();
    }
  });

  /** No fenced grant of key `late` reached database `dbName`: the give-back does not remove its counter. */
  async function noLateGrant(dbName) {
    const db = client.db(dbName);
    assert.equal(await db.collection('locco-locks-fences').findOne({ _id: 'late' }), null, 'no fencing token was counted');
    assert.equal(await db.collection('locco-locks').findOne({ key: 'late' }), null);
  }

  it('an attempt given up while its adapter still connects sends nothing, so no grant lands after its give-back', async () => {
    // The first connection takes 1.5 s, the lease 1 s: the engine gives the attempt up while
    // the driver still connects. A fenced grant that went out after that would leave its
    // fencing counter behind, which the give-back does not remove.
    const proxy = await testProxy(Number(new URL(mongo.url).port), { delay: 1500 });
    const adapter = new MongoAdapter({ url: proxy.urlFor(mongo.url), dbName: 'given_up' });
    try {
      const locker = new Locker({ adapter, fencing: true, retry: { retries: 0 } });
      const err = await locker.tryAcquire('late', { ttl: 1000 }).catch((e) => e);
      assert.ok(err instanceof BackendError && err.kind === 'timeout', String(err));
      await sleep(2500); // the connection, the give-back, and anything else still due
      await noLateGrant('given_up');
    } finally {
      await adapter.close();
      await proxy.close();
    }
  });

  it('an attempt given up while it waits for a pooled connection is not sent', async () => {
    // One pooled connection, taken by a request whose answer the network holds for 1.5 s; a
    // second attempt, with a 1 s lease, waits for it and is given up. Sent once the connection
    // came free, its fenced grant would leave a fencing counter behind.
    const proxy = await testProxy(Number(new URL(mongo.url).port));
    const url = new URL(proxy.urlFor(mongo.url));
    url.searchParams.set('maxPoolSize', '1');
    const adapter = new MongoAdapter({ url: url.href, dbName: 'pool_wait' });
    try {
      const locker = new Locker({ adapter, fencing: true, retry: { retries: 0 } });
      await (await locker.acquire('warm', { ttl: 10_000 })).release(); // connected, indexes made
      const stalled = proxy.stall(1500);
      const first = locker.tryAcquire('first', { ttl: 10_000 });
      const err = await locker.tryAcquire('late', { ttl: 1000 }).catch((e) => e);
      assert.ok(err instanceof BackendError && err.kind === 'timeout', String(err));
      await stalled;
      assert.notEqual(await first, null);
      await sleep(1000); // anything still due
      await noLateGrant('pool_wait');
    } finally {
      await adapter.close();
      await proxy.close();
    }
  });

  it('describes its indexes in the shape createIndexes takes', () => {
    assert.deepEqual(mongoLocksIndexes(), [
      { key: { key: 1 }, name: 'locco_key_unique', unique: true },
      { key: { expireAt: 1 }, name: 'locco_expireAt_ttl', expireAfterSeconds: 0 },
    ]);
  });

  it('creates its indexes and stores one document per key', async () => {
    const adapter = new MongoAdapter({ url: mongo.url, dbName: 'shape' });
    const lock = await new Locker({ adapter }).acquire('order:1', { ttl: 60_000 });
    const doc = await client.db('shape').collection('locco-locks').findOne({ key: 'order:1' });
    assert.equal(doc.uniqueValue, lock.token);
    assert.ok(doc.expireAt instanceof Date);
    const names = (await client.db('shape').collection('locco-locks').indexes()).map((i) => i.name);
    assert.ok(names.includes('locco_key_unique') && names.includes('locco_expireAt_ttl'), String(names));
  });

  it('inspect, list and forceRelease count and delete only the lock documents the library wrote', async () => {
    const adapter = new MongoAdapter({ url: mongo.url, dbName: 'not_locks' });
    const locker = new Locker({ adapter });
    try {
      const lock = await locker.acquire('nl:lock', { ttl: 60_000 });
      const coll = client.db('not_locks').collection('locco-locks');
      const later = new Date(Date.now() + 3_600_000);
      // Documents an application (or a mistake) put in the lock collection, and a key only
      // reserved for a waiter: none is a lease this library holds.
      const others = [
        { key: 'nl:number-token', uniqueValue: 42, expireAt: later },
        { key: 'nl:null-token', uniqueValue: null, expireAt: later },
        { key: 'nl:array-token', uniqueValue: ['t'], expireAt: later },
        { key: ['nl:array-key'], uniqueValue: 't', expireAt: later },
        { key: 'nl:no-expiry', uniqueValue: 't' },
        { key: 'nl:string-expiry', uniqueValue: 't', expireAt: '2999-01-01' },
        { key: 'nl:timestamp-expiry', uniqueValue: 't', expireAt: new Timestamp({ t: 4_000_000_000, i: 1 }) },
        { key: 'nl:bad-queue', uniqueValue: 't', expireAt: later, queue: 'not places' },
        { key: 'nl:reserved', expireAt: later, queue: [{ w: 'w1', a: 'a1', exp: later }] },
        { key: 'nl:profile', name: 'precious' },
      ];
      await coll.insertMany(others.map((d) => ({ ...d })));
      const names = others.map((d) => (Array.isArray(d.key) ? d.key[0] : d.key));
      for (const key of names) {
        const info = await locker.inspect(key);
        assert.equal(info.held, false, `inspect ${key}: ${JSON.stringify(info)}`);
        assert.equal(info.ttlLeft, undefined, key);
      }
      const listed = await locker.list({ prefix: 'nl:' });
      assert.deepEqual(listed.map((k) => k.key), ['nl:lock']);
      for (const key of names) {
        assert.equal(await locker.forceRelease(key), false, `forceRelease ${key}`);
      }
      for (const d of others) {
        const { _id, ...kept } = await coll.findOne({ key: d.key });
        assert.deepEqual(kept, d, `${JSON.stringify(d.key)} was changed`);
      }
      // The lock itself is seen and released as before.
      assert.equal((await locker.inspect('nl:lock')).held, true);
      assert.equal(await locker.forceRelease('nl:lock'), true);
      assert.equal(await coll.findOne({ key: 'nl:lock' }), null);
      assert.equal(await lock.isHeld(), false);
    } finally {
      await locker.close();
      await adapter.close();
    }
  });

  it('reads from the primary whatever the URL says, and writes with the configured concern', async () => {
    const url = `${mongo.url}${mongo.url.includes('?') ? '&' : '?'}readPreference=secondaryPreferred`;
    const adapter = new MongoAdapter({ url, dbName: 'prefs', writeConcern: { w: 1 } });
    const lock = await new Locker({ adapter }).acquire('k', { ttl: 5000 });
    assert.equal(await lock.isHeld(), true);
    assert.equal(await lock.release(), true);
  });

  it('fence tokens keep growing per key', async () => {
    const locker = new Locker({ adapter: new MongoAdapter({ url: mongo.url, dbName: 'fences' }), fencing: true });
    const fences = [];
    for (let i = 0; i < 3; i++) {
      const lock = await locker.acquire('f', { ttl: 5000 });
      fences.push(lock.fence);
      await lock.release();
    }
    assert.ok(fences[1] > fences[0] && fences[2] > fences[1], String(fences));
    const counter = await client.db('fences').collection('locco-locks-fences').findOne({ _id: 'f' });
    assert.equal(counter.fence, fences[2]);
  });

  it('refuses names MongoDB would reject, before anything is sent', () => {
    const url = 'mongodb://u:p@127.0.0.1:1/x';
    for (const [field, options] of [
      ['collectionName', { collectionName: '' }],
      ['collectionName', { collectionName: 'a$b' }],
      ['collectionName', { collectionName: 'a\0b' }],
      ['collectionName', { collectionName: 'x'.repeat(200) }],
      ['dbName', { dbName: '' }],
      ['dbName', { dbName: 'my.db' }],
      ['dbName', { dbName: 'x'.repeat(64) }],
    ]) {
      assert.throws(() => new MongoAdapter({ url, ...options }), (e) => e instanceof ValidationError && e.field === field, field);
    }
    assert.throws(() => new MongoAdapter({ url: 'http://x' }), ValidationError);
    assert.throws(() => new MongoAdapter({ url, writeConcern: { w: 'some' } }), ValidationError);
  });

  it('an unreachable server is a BackendError within the connect timeout, without the password', async () => {
    const port = await freePort();
    const adapter = new MongoAdapter({ url: `mongodb://app:hunter2-pw@127.0.0.1:${port}/?directConnection=true`, connectTimeout: 1000 });
    const started = performance.now();
    // A lease longer than the connect timeout, so the attempt is not cut as late first.
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 10_000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.equal(err.backend, 'mongo');
    assert.ok(['timeout', 'io'].includes(err.kind), err.kind);
    assert.ok(performance.now() - started < 4000);
    assert.doesNotMatch(err.message, /hunter2-pw/);
  });

  // A lease shorter than the driver's server selection: every attempt is cut at its lease end
  // with no answer. That is an outage, never "held elsewhere".
  it('a closed port with a short lease and retries is a timeout BackendError, not contention', async () => {
    const port = await freePort();
    const adapter = new MongoAdapter({ url: `mongodb://127.0.0.1:${port}/?directConnection=true`, connectTimeout: 5000 });
    const err = await new Locker({ adapter, retry: { retries: 2, delay: 50 } }).acquire('k', { ttl: 500 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.equal(err.kind, 'timeout');
    assert.match(err.message, /acquire of "k"/);
    await adapter.close();
  });

  it('driver errors read as sentences, not debug dumps', async () => {
    const port = await freePort();
    const adapter = new MongoAdapter({ url: `mongodb://127.0.0.1:${port}/?directConnection=true`, connectTimeout: 500 });
    const err = await new Locker({ adapter }).tryAcquire('k', { ttl: 5000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.match(err.message, new RegExp(`127\\.0\\.0\\.1:${port}: .*refused`, 'i'));
    assert.doesNotMatch(err.message, /Kind:|labels:|source: None|Topology:|server response/);
    await adapter.close();
  });

  it('a replicaSet the server is not part of is a BackendError, not contention', async () => {
    const url = mongo.url.replace('directConnection=true', 'replicaSet=not-this-one');
    const adapter = new MongoAdapter({ url, connectTimeout: 1000 });
    const err = await new Locker({ adapter, retry: { retries: 1, delay: 50 } }).acquire('k', { ttl: 3000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.ok(['timeout', 'io', 'config'].includes(err.kind), err.kind);
    assert.doesNotMatch(err.message, /Kind:|labels:|source: None|Topology:/);
    await adapter.close();
  });
});

describe('MongoAdapter through a server restart', () => {
  let mongo;
  before(async () => {
    mongo = await startMongo();
  });
  after(async () => {
    await mongo.dispose();
  });

  it('keeps a lock held with auto-extension through a server restart', async (t) => {
    if (!mongo.restart) return t.skip('LOCCO_TEST_MONGO_URL: that server is not the tests to restart');
    const adapter = new MongoAdapter({ url: mongo.url, dbName: 'restart' });
    try {
      // The lease's slack (7.5 s) outlasts a restart (a clean shutdown, which keeps the
      // document): the driver reconnects and the heartbeat goes on.
      const { locker, lock } = await heldThroughRestart(assert, adapter, () => mongo.restart(), { ttl: 8000 });
      assert.equal(await locker.tryAcquire('r', { ttl: 1000 }), null, 'still ours after the restart');
      assert.equal(await lock.release(), true);
    } finally {
      await adapter.close();
    }
  });
});
