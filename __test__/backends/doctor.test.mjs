// adapter.checkSafety() and `locco-rs doctor`, against real servers started here: a deployment
// that can break the locks is flagged unsafe, a correct one has no unsafe finding.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MongoClient } from 'mongodb';

import { InMemoryAdapter } from 'locco-rs/memory';
import { EtcdAdapter } from 'locco-rs/etcd';
import { MongoAdapter } from 'locco-rs/mongo';
import { PostgresAdapter } from 'locco-rs/postgres';
import { RedisAdapter } from 'locco-rs/redis';
import { runCli } from '../support/run-node.mjs';
import { startEtcd, startMongo, startPostgres, startRedis, startRedisCluster } from '../support/servers.mjs';

const SAMPLE = { clockSampleMs: 300 };

const ids = (findings, severity) => findings.filter((f) => f.severity === severity).map((f) => f.id);
const shown = (findings) => JSON.stringify(findings, null, 2);

function assertShape(findings) {
  assert.ok(Array.isArray(findings));
  for (const f of findings) {
    assert.deepEqual(Object.keys(f).sort(), ['fix', 'id', 'message', 'severity', 'why']);
    assert.ok(['unsafe', 'warning', 'info'].includes(f.severity), f.severity);
    for (const k of ['id', 'message', 'why', 'fix']) assert.ok(typeof f[k] === 'string' && f[k].length > 0, `${f.id}.${k}`);
  }
}

const cli = (args) => runCli(args);

describe('checkSafety on Redis', () => {
  let good;
  let evicting;
  before(async () => {
    [good, evicting] = await Promise.all([startRedis(), startRedis({ args: ['--maxmemory', '100mb', '--maxmemory-policy', 'allkeys-lru'] })]);
  });
  after(async () => {
    await Promise.all([good?.dispose(), evicting?.dispose()]);
  });

  it('finds nothing unsafe on a default server, and measures the clock', async () => {
    const adapter = new RedisAdapter({ url: good.url });
    try {
      const findings = await adapter.checkSafety(SAMPLE);
      assertShape(findings);
      assert.deepEqual(ids(findings, 'unsafe'), [], shown(findings));
      // The test servers run without persistence: a restart forgets the locks.
      assert.ok(ids(findings, 'warning').includes('redis.persistence'), shown(findings));
      const clock = findings.find((f) => f.id === 'clock.rate');
      assert.equal(clock.severity, 'info', shown(findings));
      assert.match(clock.message, /± \d+\.\d+%.*round trips over \d+ ms/);
    } finally {
      await adapter.close();
    }
  });

  it('flags an evicting policy with maxmemory set as unsafe', async () => {
    const adapter = new RedisAdapter({ url: evicting.url });
    try {
      const findings = await adapter.checkSafety(SAMPLE);
      const f = findings.find((x) => x.id === 'redis.maxmemory-policy');
      assert.ok(f, shown(findings));
      assert.equal(f.severity, 'unsafe');
      assert.match(f.message, /allkeys-lru/);
      assert.match(f.fix, /noeviction/);
      assert.equal(findings[0].severity, 'unsafe', 'most severe first');
    } finally {
      await adapter.close();
    }
  });

  it('flags a volatile policy (the one that evicts keys with a TTL: every lock)', async () => {
    evicting.cli('CONFIG', 'SET', 'maxmemory-policy', 'volatile-lru');
    const adapter = new RedisAdapter({ url: evicting.url });
    try {
      const findings = await adapter.checkSafety({ clockSampleMs: 0 });
      const f = findings.find((x) => x.id === 'redis.maxmemory-policy');
      assert.equal(f?.severity, 'unsafe', shown(findings));
      assert.match(f.why, /TTL/);
    } finally {
      evicting.cli('CONFIG', 'SET', 'maxmemory-policy', 'allkeys-lru');
      await adapter.close();
    }
  });

  it('flags waitForReplicas above the connected replicas, and replicas without it', async () => {
    const replica = await startRedis({ args: ['--replicaof', '127.0.0.1', String(good.port)] });
    try {
      const deadline = Date.now() + 20_000;
      while (!/connected_slaves:1/.test(good.cli('INFO', 'replication'))) {
        if (Date.now() > deadline) throw new Error('the replica did not connect');
        await new Promise((r) => setTimeout(r, 50));
      }
      const asking = new RedisAdapter({ url: good.url, waitForReplicas: { replicas: 2, timeout: 100 } });
      const plain = new RedisAdapter({ url: good.url });
      const enough = new RedisAdapter({ url: good.url, waitForReplicas: { replicas: 1, timeout: 100 } });
      try {
        const [a, p, e] = await Promise.all([asking, plain, enough].map((x) => x.checkSafety({ clockSampleMs: 0 })));
        const w = a.find((x) => x.id === 'redis.wait-for-replicas');
        assert.equal(w?.severity, 'unsafe', shown(a));
        assert.match(w.message, /2 replica.*1 connected/);
        assert.equal(p.find((x) => x.id === 'redis.wait-for-replicas')?.severity, 'warning', shown(p));
        assert.equal(e.find((x) => x.id === 'redis.wait-for-replicas'), undefined, shown(e));
      } finally {
        await Promise.all([asking.close(), plain.close(), enough.close()]);
      }
    } finally {
      await replica.dispose();
    }
  });

  it('flags a holder clock that runs slower than the server by more than the 1% margin', async () => {
    const adapter = new RedisAdapter({ url: good.url });
    try {
      const slow = await adapter.checkSafety({ clockSampleMs: 400, holderClockRate: 0.95 });
      const f = slow.find((x) => x.id === 'clock.rate');
      assert.equal(f.severity, 'unsafe', shown(slow));
      assert.match(f.message, /slower/);
      assert.match(f.why, /1%/);
      // Faster is safe: the holder gives its leases up early.
      const fast = await adapter.checkSafety({ clockSampleMs: 400, holderClockRate: 1.05 });
      assert.equal(fast.find((x) => x.id === 'clock.rate').severity, 'info', shown(fast));
    } finally {
      await adapter.close();
    }
  });

  it('refuses unknown options and a negative sample', async () => {
    const adapter = new RedisAdapter({ url: good.url });
    try {
      await assert.rejects(adapter.checkSafety({ clockSample: 3 }), (e) => e.code === 'LOCK_VALIDATION' && /clockSampleMs/.test(e.message));
      await assert.rejects(adapter.checkSafety({ clockSampleMs: -1 }), (e) => e.code === 'LOCK_VALIDATION' && e.field === 'clockSampleMs');
    } finally {
      await adapter.close();
    }
  });

  it('locco-rs doctor exits 6 on the evicting server and 0 on the default one; --json parses', async () => {
    const bad = await cli(['doctor', '--url', evicting.url, '--clock-sample', '300ms']);
    assert.equal(bad.code, 6, bad.stdout + bad.stderr);
    assert.match(bad.stdout, /^UNSAFE +redis\.maxmemory-policy: /m);
    assert.match(bad.stdout, /why: .*\n\s+fix: /);
    assert.match(bad.stdout, /^1 unsafe, \d+ warnings?, \d+ info: /m);
    const ok = await cli(['doctor', '--url', good.url, '--clock-sample', '300ms']);
    assert.equal(ok.code, 0, ok.stdout + ok.stderr);
    assert.match(ok.stdout, /^0 unsafe/m);
    const json = await cli(['doctor', '--url', evicting.url, '--json', '--clock-sample', '0']);
    assert.equal(json.code, 6, json.stderr);
    const parsed = JSON.parse(json.stdout);
    assertShape(parsed.findings);
    assert.equal(parsed.counts.unsafe, 1);
    assert.ok(parsed.findings.some((f) => f.id === 'redis.maxmemory-policy'));
  });

  it('locco-rs doctor: --help, usage errors (2) and an unreachable backend (5)', async () => {
    const help = await cli(['doctor', '--help']);
    assert.equal(help.code, 0);
    assert.match(help.stdout, /Usage: locco-rs doctor --url/);
    assert.equal((await cli(['doctor'])).code, 2);
    assert.equal((await cli(['doctor', '--url', good.url, '--clock-sample', 'soon'])).code, 2);
    assert.equal((await cli(['doctor', '--url', 'ftp://x'])).code, 2);
    for (const url of ['redis://127.0.0.1:1', 'etcd://127.0.0.1:1', 'postgres://u:p@127.0.0.1:1/db']) {
      const down = await cli(['doctor', '--url', url, '--clock-sample', '0']);
      assert.equal(down.code, 5, `${url}: ${down.stdout}${down.stderr}`);
    }
    assert.match((await cli(['--help'])).stdout, /doctor/);
  });
});

describe('checkSafety on a Redis Cluster, and a Redis without CONFIG', () => {
  let cluster;
  let lonely;
  let noConfig;
  before(async () => {
    cluster = await startRedisCluster();
    // A Cluster node that was never given slots.
    lonely = await startRedis({ cluster: true });
    noConfig = await startRedis({ args: ['--rename-command', 'CONFIG', ''] });
  });
  after(async () => {
    await Promise.all([cluster, lonely, noConfig].map((n) => n?.dispose()));
  });

  it('finds nothing unsafe on a healthy Cluster, and flags one without its slots', async () => {
    const healthy = new RedisAdapter({ urls: cluster.urls, cluster: true });
    const broken = new RedisAdapter({ urls: [lonely.url], cluster: true, connectTimeout: 2000 });
    try {
      const ok = await healthy.checkSafety({ clockSampleMs: 300 });
      assertShape(ok);
      assert.deepEqual(ids(ok, 'unsafe'), [], shown(ok));
      assert.equal(ok.at(-1).id, 'clock.rate', shown(ok));
      const bad = await broken.checkSafety({ clockSampleMs: 0 });
      const f = bad.find((x) => x.id === 'redis.cluster');
      assert.equal(f?.severity, 'unsafe', shown(bad));
      assert.match(f.message, /0 of 16384 slots/);
    } finally {
      await Promise.all([healthy.close(), broken.close()]);
    }
  });

  it('reports a renamed CONFIG as "could not check", and still checks the rest', async () => {
    const adapter = new RedisAdapter({ url: noConfig.url });
    try {
      const findings = await adapter.checkSafety({ clockSampleMs: 300 });
      assertShape(findings);
      const f = findings.find((x) => x.id === 'redis.config');
      assert.equal(f?.severity, 'info', shown(findings));
      assert.match(f.message, /^could not check/);
      assert.equal(findings.find((x) => x.id === 'clock.rate')?.severity, 'info', shown(findings));
    } finally {
      await adapter.close();
    }
  });
});

describe('checkSafety on PostgreSQL', () => {
  let pg;
  before(async () => {
    pg = await startPostgres();
  });
  after(async () => {
    await pg?.dispose();
  });

  it('finds nothing unsafe on the default table', async () => {
    const adapter = new PostgresAdapter({ url: pg.url });
    try {
      // The adapter makes its table at first use; the check itself never creates it.
      const before = await adapter.checkSafety({ clockSampleMs: 0 });
      assert.equal(before.find((f) => f.id === 'postgres.table')?.severity, 'info', shown(before));
      assert.equal(pg.psql("SELECT to_regclass('locco_locks') IS NULL"), 't');
      await adapter.acquire({ key: 'doctor', token: 't', ttl: 1000 });
      const findings = await adapter.checkSafety(SAMPLE);
      assertShape(findings);
      assert.deepEqual(ids(findings, 'unsafe'), [], shown(findings));
      assert.equal(findings.find((f) => f.id === 'postgres.table'), undefined);
      // The test server runs with fsync off.
      assert.ok(ids(findings, 'warning').includes('postgres.fsync'), shown(findings));
      assert.equal(findings.find((f) => f.id === 'clock.rate')?.severity, 'info', shown(findings));
    } finally {
      await adapter.close();
    }
  });

  it('flags a lock table without its primary key as unsafe', async () => {
    pg.psql('CREATE TABLE nokey_locks (key text NOT NULL, token text NOT NULL, expires_at timestamptz NOT NULL)');
    const adapter = new PostgresAdapter({ url: pg.url, tableName: 'nokey_locks', createTable: false });
    try {
      const findings = await adapter.checkSafety({ clockSampleMs: 0 });
      const f = findings.find((x) => x.id === 'postgres.primary-key');
      assert.equal(f?.severity, 'unsafe', shown(findings));
      assert.match(f.fix, /ADD PRIMARY KEY/);
      // No sequence either: fenced acquires would fail.
      assert.equal(findings.find((x) => x.id === 'postgres.fence-sequence')?.severity, 'warning', shown(findings));
    } finally {
      await adapter.close();
    }
  });

  it('flags a role without rights on the table, and a missing table with createTable off', async () => {
    pg.psql("CREATE ROLE doctor_ro LOGIN PASSWORD 'ro-pw'");
    pg.psql('GRANT SELECT ON locco_locks TO doctor_ro');
    const ro = new PostgresAdapter({ url: pg.urlFor('doctor_ro', 'ro-pw') });
    const missing = new PostgresAdapter({ url: pg.url, tableName: 'absent_locks', createTable: false });
    try {
      const findings = await ro.checkSafety({ clockSampleMs: 0 });
      const f = findings.find((x) => x.id === 'postgres.privileges');
      assert.equal(f?.severity, 'unsafe', shown(findings));
      assert.match(f.message, /INSERT, UPDATE, DELETE/);
      const absent = await missing.checkSafety({ clockSampleMs: 0 });
      assert.equal(absent.find((x) => x.id === 'postgres.table')?.severity, 'warning', shown(absent));
    } finally {
      await Promise.all([ro.close(), missing.close()]);
    }
  });

  it('warns of synchronous_commit off for the role', async () => {
    pg.psql("CREATE ROLE doctor_async LOGIN PASSWORD 'async-pw'");
    pg.psql('GRANT SELECT, INSERT, UPDATE, DELETE ON locco_locks TO doctor_async');
    pg.psql('GRANT USAGE ON SEQUENCE locco_locks_fence TO doctor_async');
    pg.psql('ALTER ROLE doctor_async SET synchronous_commit = off');
    const adapter = new PostgresAdapter({ url: pg.urlFor('doctor_async', 'async-pw') });
    try {
      const findings = await adapter.checkSafety({ clockSampleMs: 0 });
      assert.equal(findings.find((f) => f.id === 'postgres.synchronous-commit')?.severity, 'warning', shown(findings));
      assert.deepEqual(ids(findings, 'unsafe'), [], shown(findings));
    } finally {
      await adapter.close();
    }
  });

  it('locco-rs doctor exits 0 on the default table', async () => {
    const r = await cli(['doctor', '--url', pg.url, '--clock-sample', '300ms']);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /clock\.rate: the holder's clock ran/);
  });
});

describe('checkSafety on MongoDB', () => {
  let mongo;
  before(async () => {
    mongo = await startMongo();
  });
  after(async () => {
    await mongo?.dispose();
  });

  it('finds nothing unsafe once the indexes exist, and flags a collection without them', async () => {
    const good = new MongoAdapter({ url: mongo.url, dbName: 'doctor' });
    const bare = new MongoAdapter({ url: mongo.url, dbName: 'doctor', collectionName: 'bare', createIndexes: false });
    const client = new MongoClient(mongo.url);
    try {
      await good.acquire({ key: 'doctor', token: 't', ttl: 1000 });
      const findings = await good.checkSafety(SAMPLE);
      assertShape(findings);
      assert.deepEqual(ids(findings, 'unsafe'), [], shown(findings));
      assert.equal(findings.find((f) => f.id === 'mongo.unique-index'), undefined, shown(findings));
      assert.equal(findings.find((f) => f.id === 'mongo.ttl-index'), undefined, shown(findings));
      // Not there at all: every operation would fail (createIndexes is off).
      const absent = await bare.checkSafety({ clockSampleMs: 0 });
      assert.equal(absent.find((f) => f.id === 'mongo.indexes')?.severity, 'warning', shown(absent));
      // There, made by someone else without the indexes.
      await client.db('doctor').collection('bare').insertOne({ key: 'other', token: 'x' });
      const noIndexes = await bare.checkSafety({ clockSampleMs: 0 });
      assert.equal(noIndexes.find((f) => f.id === 'mongo.unique-index')?.severity, 'unsafe', shown(noIndexes));
      assert.equal(noIndexes.find((f) => f.id === 'mongo.ttl-index')?.severity, 'warning', shown(noIndexes));
    } finally {
      await Promise.all([good.close(), bare.close(), client.close()]);
    }
  });

  it('flags w: 1 on a replica set, and leaves the default (majority) alone', async () => {
    const w1 = new MongoAdapter({ url: mongo.url, dbName: 'doctor', writeConcern: { w: 1 } });
    const majority = new MongoAdapter({ url: mongo.url, dbName: 'doctor' });
    try {
      const findings = await w1.checkSafety({ clockSampleMs: 0 });
      assertShape(findings);
      // secantusd-rs answers hello as a one-member replica set; a plain mongod as a standalone.
      const standalone = findings.some((f) => f.id === 'mongo.topology');
      const w = findings.find((f) => f.id === 'mongo.write-concern');
      if (standalone) assert.equal(w, undefined, shown(findings));
      else assert.equal(w?.severity, 'warning', shown(findings));
      const plain = await majority.checkSafety({ clockSampleMs: 0 });
      assert.equal(plain.find((f) => f.id === 'mongo.write-concern'), undefined, shown(plain));
    } finally {
      await Promise.all([w1.close(), majority.close()]);
    }
  });
});

describe('checkSafety on etcd and in memory', () => {
  let etcd;
  before(async () => {
    etcd = await startEtcd();
  });
  after(async () => {
    await etcd?.dispose();
  });

  it('warns of a single-member etcd cluster', async () => {
    const adapter = new EtcdAdapter({ endpoints: [etcd.endpoint] });
    try {
      const findings = await adapter.checkSafety();
      assertShape(findings);
      assert.deepEqual(ids(findings, 'unsafe'), [], shown(findings));
      assert.equal(findings.find((f) => f.id === 'etcd.members')?.severity, 'warning', shown(findings));
    } finally {
      await adapter.close();
    }
  });

  it('answers one info finding for the in-memory adapter', async () => {
    const findings = await new InMemoryAdapter().checkSafety();
    assertShape(findings);
    assert.deepEqual(findings.map((f) => f.severity), ['info']);
  });
});
