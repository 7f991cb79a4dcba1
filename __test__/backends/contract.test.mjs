import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { runLockAdapterContract } from 'locco-rs/testing';
import { InMemoryAdapter } from 'locco-rs/memory';
import { registerContractForTest } from '../support/contract-internal.mjs';
import { MapAdapter, QueuedMapAdapter, UnfencedMapAdapter, brokenAdapters } from '../support/map-adapter.mjs';
import { runCollected } from '../support/collect.mjs';
import { RedisAdapter, RedlockAdapter } from 'locco-rs/redis';
import { PostgresAdapter } from 'locco-rs/postgres';
import { MongoAdapter } from 'locco-rs/mongo';
import { startMongo, startPostgres, startRedis, valkeyBinary } from '../support/servers.mjs';
import { EtcdAdapter } from 'locco-rs/etcd';
import { startEtcd } from '../support/servers.mjs';

const redis = await startRedis();
const valkey = await startRedis({ binary: valkeyBinary() });
const postgres = await startPostgres();
const mongo = await startMongo();
after(() => Promise.all([redis.dispose(), valkey.dispose(), postgres.dispose(), mongo.dispose()]));
const redlockServers = await Promise.all([1, 2, 3].map(() => startRedis()));
after(() => Promise.all(redlockServers.map((s) => s.dispose())));
const etcd = await startEtcd();
after(() => etcd.dispose());

runLockAdapterContract('InMemoryAdapter', () => ({ adapter: new InMemoryAdapter() }));
runLockAdapterContract('MapAdapter (reference, JavaScript)', async () => ({ adapter: new MapAdapter() }));
runLockAdapterContract('RedisAdapter', () => {
  const adapter = new RedisAdapter({ url: redis.url });
  return { adapter, cleanup: () => adapter.close() };
});
runLockAdapterContract('RedisAdapter on Valkey', () => {
  const adapter = new RedisAdapter({ url: valkey.url });
  return { adapter, cleanup: () => adapter.close() };
});
runLockAdapterContract('RedlockAdapter (3 servers)', () => {
  const adapter = new RedlockAdapter({ urls: redlockServers.map((s) => s.url) });
  return { adapter, cleanup: () => adapter.close() };
});
runLockAdapterContract('PostgresAdapter', () => {
  const adapter = new PostgresAdapter({ url: postgres.url, poolSize: 4 });
  return { adapter, cleanup: () => adapter.close() };
});
runLockAdapterContract('PostgresAdapter (advisory)', () => { const adapter = new PostgresAdapter({ url: postgres.url, mode: 'advisory', poolSize: 8 }); return { adapter, cleanup: () => adapter.close() }; });
runLockAdapterContract(`MongoAdapter (${mongo.name})`, () => {
  const adapter = new MongoAdapter({ url: mongo.url, dbName: 'contract' });
  return { adapter, cleanup: () => adapter.close() };
});
runLockAdapterContract('EtcdAdapter', () => {
  const adapter = new EtcdAdapter({ endpoints: [etcd.endpoint] });
  return { adapter, cleanup: () => adapter.close() };
});
runLockAdapterContract('QueuedMapAdapter (reference with the queue methods)', () => ({ adapter: new QueuedMapAdapter() }));
runLockAdapterContract('MapAdapter without fencing', () => ({ adapter: new UnfencedMapAdapter() }));

describe('the contract suite can fail', { concurrency: true }, () => {
  it('passes the reference adapter when run by hand (the collector works)', async () => {
    const { total, failed } = await runCollected((r) =>
      registerContractForTest('reference', () => ({ adapter: new MapAdapter() }), r),
    );
    assert.ok(total >= 9);
    assert.deepEqual(failed, []);
  });

  for (const [rule, Broken] of Object.entries(brokenAdapters)) {
    it(`catches an adapter where ${rule}`, async () => {
      const { failed } = await runCollected((r) =>
        registerContractForTest(rule, () => ({ adapter: new Broken() }), r),
      );
      assert.ok(failed.length >= 1, `no contract test failed for "${rule}"`);
    });
  }
});
