// Batched renewals (Backend::extend_many) against real servers, one started per backend for the
// file: many auto-extended locks on one Locker, one of them deleted behind its back. That one
// must be lost ('extend') and every other still held; and where the server counts what it was
// sent, the count shows far fewer operations than renewals.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MongoClient } from 'mongodb';
import { Locker } from 'locco-rs';
import { EtcdAdapter } from 'locco-rs/etcd';
import { MongoAdapter } from 'locco-rs/mongo';
import { PostgresAdapter } from 'locco-rs/postgres';
import { RedisAdapter } from 'locco-rs/redis';
import { startEtcd, startMongo, startPostgres, startRedis, testProxy } from '../support/servers.mjs';
import { sleep, until } from '../support/adapters.mjs';

const COUNT = 300;
const TTL = 1500;
/** The default interval: a third of the ttl. */
const INTERVAL = TTL / 3;
/** How many intervals the server's counter is read over. */
const WINDOW = 4;
/** The lock deleted behind the locker's back. */
const VICTIM = 17;

/**
 * Holds COUNT locks `${prefix}${i}` with autoExtend, deletes lock VICTIM through `remove(key)`
 * after one interval, and checks that only that one is lost. `counter()` reads the server's
 * count of operations (or is undefined); its delta over WINDOW intervals, once the loss is
 * seen, must stay far below the renewals sent meanwhile. Answers the delta.
 */
async function oneLostAmongMany({ locker, prefix, remove, counter }) {
  const locks = await Promise.all(
    Array.from({ length: COUNT }, (_, i) => locker.acquire(`${prefix}${i}`, { ttl: TTL, autoExtend: { maxHold: 120_000 } })),
  );
  try {
    await sleep(INTERVAL + 150);
    await remove(`${prefix}${VICTIM}`);
    const victim = locks[VICTIM];
    await until(() => victim.state === 'lost', 4 * INTERVAL + 1000).catch(() =>
      assert.fail(`the deleted lock is still ${victim.state} after several intervals`),
    );
    assert.equal(victim.lostReason, 'extend');
    // Count once the heartbeats have come together: the acquires finished over a while (some
    // 150 ms here), and the engine lets a tick run only a little early (a twentieth of its
    // interval) to join a batch, so the first few intervals still send many small batches.
    // That wait also lets PostgreSQL count the acquires (a backend flushes its statistics at
    // most once a second).
    await sleep(1200 + 4 * INTERVAL);
    const before = counter ? await counter() : undefined;
    await sleep(WINDOW * INTERVAL);
    const after = counter ? await counter() : undefined;
    const others = locks.filter((_, i) => i !== VICTIM);
    const notHeld = others.map((l, i) => [i, l.state, l.lostReason]).filter(([, state]) => state !== 'held');
    assert.deepEqual(notHeld, [], 'every other lock is still held');
    assert.equal(victim.state, 'lost');
    for (const i of [0, 1, 99, 150, 298]) assert.equal(await others[i].isHeld(), true, `lock ${i} is held on the server`);
    assert.equal(await victim.isHeld(), false);
    // Still ours on the server, long after the first ttl ran out.
    const released = await Promise.all(others.map((l) => l.release()));
    assert.equal(released.filter(Boolean).length, COUNT - 1);
    return before === undefined ? undefined : after - before;
  } finally {
    await Promise.all(locks.map((l) => (l.state === 'held' ? l.release().catch(() => {}) : null)));
  }
}

/** Renewals sent over the counting window: one per live lock per interval. */
const RENEWALS = (COUNT - 1) * WINDOW;

/**
 * The most batches the engine can send over the window, however spread the acquisitions
 * were: a tick takes along every tick due within 25 ms of it, so the next batch leaves at
 * least 25 ms later, and a batch's locks stay together from then on. A loaded machine spreads
 * 300 acquisitions over much of an interval, which comes near this bound.
 */
const MOST_BATCHES = WINDOW * (INTERVAL / 25 + 1);

describe('Redis', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis?.dispose());

  it('renews many locks in few script calls; a deleted key is lost alone', async (t) => {
    const adapter = new RedisAdapter({ url: redis.url });
    const locker = new Locker({ adapter });
    // Script calls the server ran (grants are SET NX, releases and extensions scripts).
    const scripts = () => redis.calls('evalsha');
    try {
      const delta = await oneLostAmongMany({
        locker,
        prefix: 'redis:',
        remove: (key) => assert.equal(redis.cli('DEL', key), '1'),
        counter: scripts,
      });
      t.diagnostic(`${delta} script calls for ${RENEWALS} renewals`);
      assert.ok(delta < RENEWALS / 10, `${delta} script calls for ${RENEWALS} renewals`);
    } finally {
      await adapter.close();
    }
  });

  it('a batch renewal sets each key to expire one ttl after the batch ran', async () => {
    const adapter = new RedisAdapter({ url: redis.url });
    const locker = new Locker({ adapter });
    const locks = await Promise.all(
      Array.from({ length: 20 }, (_, i) => locker.acquire(`redis-ttl:${i}`, { ttl: TTL, autoExtend: { maxHold: 60_000 } })),
    );
    try {
      // Past the first ttl: only the renewals keep the keys.
      await sleep(TTL + INTERVAL);
      for (const lock of locks) {
        assert.equal(lock.state, 'held');
        const left = Number(redis.cli('PTTL', lock.key));
        // At most one ttl, and renewed within the last interval or so.
        assert.ok(left <= TTL && left > TTL - 2 * INTERVAL, `${lock.key}: PTTL ${left} ms for a ttl of ${TTL} ms`);
      }
    } finally {
      await Promise.all(locks.map((l) => l.release()));
      await adapter.close();
    }
  });

  // A key that is no longer a string (here a hash, written behind the locker's back) is not
  // ours. Reading it with GET raised WRONGTYPE and failed the whole batch, so every lock in it
  // failed to extend until its lease ran out.
  it('a key turned into a hash among many is lost alone', async () => {
    const adapter = new RedisAdapter({ url: redis.url });
    const locker = new Locker({ adapter });
    try {
      await oneLostAmongMany({
        locker,
        prefix: 'redis-type:',
        remove: (key) => {
          assert.equal(redis.cli('DEL', key), '1');
          assert.equal(redis.cli('HSET', key, 'f', 'v'), '1');
        },
      });
    } finally {
      await adapter.close();
    }
  });
});

describe('PostgreSQL', () => {
  let pg;
  before(async () => {
    pg = await startPostgres();
  });
  after(() => pg.dispose());

  it('renews many locks in few statements; a deleted row is lost alone', async (t) => {
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'renewals', poolSize: 10 });
    const locker = new Locker({ adapter });
    try {
      const commits = () => Number(pg.psql(`SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`));
      const delta = await oneLostAmongMany({
        locker,
        prefix: 'pg:',
        remove: (key) => assert.equal(pg.psql(`DELETE FROM renewals WHERE key = '${key}' RETURNING key`), key),
        counter: commits,
      });
      t.diagnostic(`${delta} transactions committed for ${RENEWALS} renewals`);
      // Looser than elsewhere: 300 acquires through a pool of 10 spread over about a second,
      // and a tick joins only the batches due within 25 ms of it, so the locks keep renewing
      // in up to some 40 batches per interval (measured: 14 to 175 over the window).
      assert.ok(delta < RENEWALS / 4, `${delta} transactions for ${RENEWALS} renewals`);
    } finally {
      await adapter.close();
    }
  });
});

describe('MongoDB', () => {
  let mongo;
  let client;
  before(async () => {
    mongo = await startMongo();
    client = new MongoClient(mongo.url);
  });
  after(async () => {
    await client?.close();
    await mongo?.dispose();
  });

  /** Every request the server received, from any client (ours, the driver's monitoring and these readings too): the round trips. */
  const commands = async () => {
    const { network } = await client.db('admin').command({ serverStatus: 1 });
    return Number(network.numRequests);
  };

  /** The server's count of `bulkWrite` and `update` commands. */
  const writes = async () => {
    const { bulkWrite, update } = (await client.db('admin').command({ serverStatus: 1 })).metrics.commands;
    return { bulkWrite: Number(bulkWrite.total), update: Number(update.total) };
  };

  it('renews many locks in few commands; a deleted document is lost alone', async (t) => {
    const adapter = new MongoAdapter({ url: mongo.url, dbName: 'renewals' });
    const locks = client.db('renewals').collection('locco-locks');
    try {
      const before = await writes();
      const delta = await oneLostAmongMany({
        locker: new Locker({ adapter }),
        prefix: 'mongo:',
        remove: async (key) => assert.equal((await locks.deleteOne({ key })).deletedCount, 1),
        counter: commands,
      });
      t.diagnostic(`${delta} requests served for ${RENEWALS} renewals`);
      // Two requests a batch (updateMany, then a find for which locks it matched), and a few
      // of the driver's own (its monitor's hello) and this test's serverStatus.
      assert.ok(delta <= 2 * MOST_BATCHES + 12, `${delta} requests for ${RENEWALS} renewals`);
      const after = await writes();
      t.diagnostic(`bulkWrite ${after.bulkWrite - before.bulkWrite}, update ${after.update - before.update}`);
      // updateMany, not a bulkWrite of an update per lock (a transaction each, on secantusd-rs).
      assert.ok(after.update - before.update >= WINDOW, 'renewed by update');
      assert.equal(after.bulkWrite, before.bulkWrite, 'no bulkWrite');
    } finally {
      await adapter.close();
    }
  });

  // A batch matches its documents by key and by token; a key whose document carries the token
  // of another lock in the same batch (here two swapped behind the locker's back, as holders
  // that share a token source could leave them) is not that lock's, and must be lost.
  it("a document carrying another renewal's token is lost, not renewed", async () => {
    const adapter = new MongoAdapter({ url: mongo.url, dbName: 'swapped' });
    let n = 0;
    const locker = new Locker({ adapter, token: () => `swap-token-${n++}` });
    const docs = client.db('swapped').collection('locco-locks');
    try {
      const locks = await Promise.all(
        Array.from({ length: 20 }, (_, i) => locker.acquire(`swap:${i}`, { ttl: TTL, autoExtend: { maxHold: 60_000 } })),
      );
      const [a, b] = locks;
      await docs.updateOne({ key: a.key }, { $set: { uniqueValue: b.token } });
      await docs.updateOne({ key: b.key }, { $set: { uniqueValue: a.token } });
      await until(() => a.state === 'lost' && b.state === 'lost', 4 * INTERVAL + 1000).catch(() =>
        assert.fail(`the swapped locks are ${a.state} and ${b.state} after several intervals`),
      );
      assert.deepEqual([a.lostReason, b.lostReason], ['extend', 'extend']);
      await sleep(INTERVAL);
      assert.deepEqual(locks.slice(2).map((l) => l.state), Array(18).fill('held'));
      await Promise.all(locks.slice(2).map((l) => l.release()));
    } finally {
      await adapter.close();
    }
  });
});

describe('etcd', () => {
  let etcd;
  before(async () => {
    etcd = await startEtcd();
  });
  after(() => etcd?.dispose());

  it('renews many locks in few transactions; a deleted key is lost alone', async (t) => {
    const prefix = 'renewals/';
    const adapter = new EtcdAdapter({ endpoints: [etcd.endpoint], prefix });
    const locker = new Locker({ adapter });
    // Every Txn the member served (grants, extensions, deletes by value).
    const txns = async () => {
      const text = await (await fetch(`${etcd.url}/metrics`)).text();
      const line = text.split('\n').find((l) => l.startsWith('grpc_server_started_total{') && l.includes('grpc_method="Txn"'));
      return Number(line.split(' ').pop());
    };
    try {
      const b64 = (s) => Buffer.from(s).toString('base64');
      const delta = await oneLostAmongMany({
        locker,
        prefix: 'etcd:',
        remove: async (key) => {
          const r = await etcd.call(etcd.members[0], 'kv/deleterange', { key: b64(`${prefix}${key}`) });
          assert.equal(r.deleted, '1');
        },
        counter: txns,
      });
      t.diagnostic(`${delta} Txn calls for ${RENEWALS} renewals`);
      assert.ok(delta < RENEWALS / 10, `${delta} transactions for ${RENEWALS} renewals`);
    } finally {
      await adapter.close();
    }
  });
});
