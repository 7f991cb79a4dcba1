// What a connection URL may carry: a Redis URL's database (`/4` or `?db=4`) is used by every
// connection the adapter makes, and on every backend a URL parameter the adapter would not
// apply is refused by name. The refusals need no server; the rest runs against real servers
// started here.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, it } from 'node:test';
import { Locker, LockHeldError, ValidationError } from 'locco-rs';
import { EtcdAdapter } from 'locco-rs/etcd';
import { MongoAdapter } from 'locco-rs/mongo';
import { PostgresAdapter } from 'locco-rs/postgres';
import { RedisAdapter, RedlockAdapter } from 'locco-rs/redis';
import { redisIsExternal, startMongo, startPostgres, startRedis } from '../support/servers.mjs';

const { URL_PARAMETERS } = createRequire(import.meta.url)('../../lib/url.js');

let n = 0;
const unique = (name) => `urls:${process.pid}:${++n}:${name}`;

/** The ValidationError `fn` throws; fails when it throws anything else or nothing. */
function refusal(fn) {
  let error;
  try {
    fn();
  } catch (e) {
    error = e;
  }
  assert.ok(error instanceof ValidationError, `expected a ValidationError, got ${error}`);
  return error;
}

describe('URL parameters an adapter does not apply are refused by name', () => {
  it('Redis takes db only, and says so', () => {
    const e = refusal(() => new RedisAdapter({ url: 'redis://app:s3cr3t@127.0.0.1:1/0?timeout=5' }));
    assert.equal(e.field, 'url');
    assert.match(e.message, /parameter timeout\b/);
    assert.match(e.message, /takes db\b/);
    assert.doesNotMatch(e.message, /s3cr3t/);
    // A near miss gets a suggestion; a Cluster's and a Redlock's URLs are checked one by one.
    assert.match(refusal(() => new RedisAdapter({ url: 'redis://127.0.0.1:1?DB=4' })).message, /did you mean db\?/);
    assert.equal(refusal(() => new RedisAdapter({ urls: ['redis://127.0.0.1:1', 'redis://127.0.0.1:2?x=1'], cluster: true })).field, 'urls[1]');
    const urls = ['redis://127.0.0.1:1', 'redis://127.0.0.1:2', 'rediss://127.0.0.1:3?protocol=3'];
    const r = refusal(() => new RedlockAdapter({ urls }));
    assert.equal(r.field, 'urls[2]');
    assert.match(r.message, /parameter protocol\b/);
  });

  it("a Redis URL's database must be a whole number, given once, and 0 on a Cluster", () => {
    for (const url of ['redis://127.0.0.1:1/x', 'redis://127.0.0.1:1/-1', 'redis://127.0.0.1:1?db=', 'redis://127.0.0.1:1?db=1.5', 'redis://127.0.0.1:1/1/2']) {
      const e = refusal(() => new RedisAdapter({ url }));
      assert.equal(e.field, 'url', url);
      assert.match(e.message, /database/, url);
    }
    const both = refusal(() => new RedisAdapter({ url: 'redis://u:pw123456@127.0.0.1:1/4?db=5' }));
    assert.equal(both.field, 'url');
    assert.match(both.message, /4.*5|5.*4/);
    assert.doesNotMatch(both.message, /pw123456/);
    const twice = refusal(() => new RedisAdapter({ url: 'redis://127.0.0.1:1?db=4&db=5' }));
    assert.equal(twice.field, 'url');
    // The same database both ways is one database.
    new RedisAdapter({ url: 'redis://127.0.0.1:1/4?db=4' }).close();
    const cluster = refusal(() => new RedisAdapter({ urls: ['redis://127.0.0.1:1', 'redis://127.0.0.1:2/3'], cluster: true }));
    assert.equal(cluster.field, 'urls[1]');
    assert.match(cluster.message, /Cluster/);
    assert.equal(refusal(() => new RedisAdapter({ url: 'redis://127.0.0.1:1?db=2', cluster: true })).field, 'url');
    new RedisAdapter({ urls: ['redis://127.0.0.1:1/0', 'redis://127.0.0.1:2?db=0'], cluster: true }).close();
    assert.equal(refusal(() => new RedlockAdapter({ urls: ['redis://127.0.0.1:1', 'redis://127.0.0.1:2', 'redis://127.0.0.1:3/z'] })).field, 'urls[2]');
  });

  it("PostgreSQL takes the driver's parameters, and refuses connect_timeout for the option", () => {
    const ok = 'postgres://u:pw@127.0.0.1:1/db?sslmode=disable&application_name=app&options=-c%20search_path%3Dx'
      + '&keepalives=1&keepalives_idle=30&target_session_attrs=read-write&channel_binding=prefer&load_balance_hosts=disable';
    new PostgresAdapter({ url: ok }).close();
    const e = refusal(() => new PostgresAdapter({ url: 'postgres://u:hunter22@127.0.0.1:1/db?sslrootcert=/ca.pem' }));
    assert.equal(e.field, 'url');
    assert.match(e.message, /parameter sslrootcert\b/);
    assert.match(e.message, /tls\.ca/);
    assert.match(e.message, /application_name/);
    assert.doesNotMatch(e.message, /hunter22/);
    assert.match(refusal(() => new PostgresAdapter({ url: 'postgres://u@127.0.0.1:1/db?connect_timeout=3' })).message, /connectTimeout option/);
    assert.match(refusal(() => new PostgresAdapter({ url: 'postgresql://u@127.0.0.1:1/db?sslmod=require' })).message, /did you mean sslmode\?/);
    // The key=value form too.
    const kv = refusal(() => new PostgresAdapter({ url: "host=127.0.0.1 port=1 user=u password='a b' connect_timeout=3" }));
    assert.equal(kv.field, 'url');
    assert.match(kv.message, /parameter connect_timeout\b/);
    assert.doesNotMatch(kv.message, /a b/);
    new PostgresAdapter({ url: "host=127.0.0.1 port=1 user=u password='a=b c' application_name=x" }).close();
  });

  it('every PostgreSQL parameter taken is one the driver reads (it parses the URL at construction)', () => {
    const sample = {
      user: 'u', password: 'p', dbname: 'd', host: '127.0.0.1', hostaddr: '127.0.0.1', port: '1', options: '-c x=1',
      application_name: 'a', sslmode: 'verify-full', sslnegotiation: 'postgres', channel_binding: 'prefer',
      target_session_attrs: 'read-write', load_balance_hosts: 'random', keepalives: '1', keepalives_idle: '1',
      keepalives_interval: '1', keepalives_retries: '1', tcp_user_timeout: '1',
    };
    assert.deepEqual(Object.keys(sample).sort(), [...URL_PARAMETERS.postgres.takes].sort());
    for (const [name, value] of Object.entries(sample)) {
      new PostgresAdapter({ url: `postgres://u@127.0.0.1:1/db?${name}=${encodeURIComponent(value)}` }).close();
    }
  });

  it("MongoDB takes the driver's options in any case, and refuses the timeouts the adapter sets itself", () => {
    // An application's URL as a hosted service gives it serves as it is.
    new MongoAdapter({ url: 'mongodb+srv://app:pw@cluster0.example.net/?retryWrites=true&w=majority&appName=Cluster0' }).close();
    new MongoAdapter({ url: 'mongodb://127.0.0.1:1/db?replicaSet=rs0&authSource=admin&APPNAME=x&readPreference=secondary&maxPoolSize=5' }).close();
    const e = refusal(() => new MongoAdapter({ url: 'mongodb://u:topsecret@127.0.0.1:1/db?serverSelectionTimeoutMS=100' }));
    assert.equal(e.field, 'url');
    assert.match(e.message, /parameter serverSelectionTimeoutMS\b/);
    assert.match(e.message, /connectTimeout option/);
    assert.match(e.message, /replicaSet/);
    assert.doesNotMatch(e.message, /topsecret/);
    assert.match(refusal(() => new MongoAdapter({ url: 'mongodb://127.0.0.1:1/?connecttimeoutms=100' })).message, /connectTimeout option/);
    assert.match(refusal(() => new MongoAdapter({ url: 'mongodb://127.0.0.1:1/?compressors=zstd' })).message, /parameter compressors, which this adapter does not apply/);
    // A value the driver cannot read is refused now too, not at the first connect.
    const value = refusal(() => new MongoAdapter({ url: 'mongodb://u:topsecret@127.0.0.1:1/?maxPoolSize=many' }));
    assert.equal(value.field, 'url');
    assert.match(value.message, /maxpoolsize/i);
    assert.doesNotMatch(value.message, /topsecret/);
    assert.match(refusal(() => new MongoAdapter({ url: 'mongodb+srv://cluster.example.com/?replicaset=a&tlsCAfle=x' })).message, /did you mean tlsCAFile\?/);
  });

  it('etcd endpoints take no parameters', () => {
    const e = refusal(() => new EtcdAdapter({ endpoints: ['127.0.0.1:2379', 'http://127.0.0.1:2380?timeout=5'] }));
    assert.equal(e.field, 'endpoints[1]');
    assert.match(e.message, /parameter timeout\b/);
  });
});

const ownServer = redisIsExternal() && 'needs a Redis server of its own (LOCCO_TEST_REDIS_URL names a shared one)';

describe("a Redis URL's database", { skip: ownServer }, () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis?.dispose());

  // Both connections: the one on the event loop, and the driver's (LOCCO_REDIS_PORTABLE=1, the
  // connection Windows uses), which the variable picks when the adapter is made.
  for (const portable of [false, true]) {
    const make = (url) => {
      const before = process.env.LOCCO_REDIS_PORTABLE;
      if (portable) process.env.LOCCO_REDIS_PORTABLE = '1';
      try {
        return new RedisAdapter({ url });
      } finally {
        if (before === undefined) delete process.env.LOCCO_REDIS_PORTABLE;
        else process.env.LOCCO_REDIS_PORTABLE = before;
      }
    };
    const path = portable ? "the driver's connection" : 'the event-loop connection';

    for (const form of ['/4', '?db=4']) {
      it(`${form} keeps the locks in database 4 (${path})`, async () => {
        const key = unique('db');
        const adapters = [make(`${redis.url}${form}`), make(`${redis.url}/4`), make(`${redis.url}/0`), make(redis.url)];
        const [holder, rival, db0, plain] = adapters.map((adapter) => new Locker({ adapter, retry: { retries: 0 } }));
        try {
          const lock = await holder.acquire(key, { ttl: 30_000 });
          assert.equal(redis.cli('-n', '4', 'EXISTS', key), '1');
          assert.equal(redis.cli('-n', '0', 'EXISTS', key), '0');
          assert.equal((await holder.inspect(key)).held, true);
          assert.equal((await rival.inspect(key)).held, true);
          assert.equal((await db0.inspect(key)).held, false);
          await assert.rejects(rival.acquire(key, { ttl: 1000 }), LockHeldError);
          // Database 0 is another namespace: the same key is free there.
          const other = await db0.acquire(key, { ttl: 1000 });
          assert.equal(redis.cli('-n', '0', 'EXISTS', key), '1');
          await other.release();
          assert.deepEqual((await holder.list({ prefix: key })).map((l) => l.key), [key]);
          assert.deepEqual(await db0.list({ prefix: key }), []);
          // forceRelease acts in its adapter's database only.
          assert.equal(await db0.forceRelease(key), false);
          assert.equal(redis.cli('-n', '4', 'EXISTS', key), '1');
          const forced = unique('forced');
          await holder.acquire(forced, { ttl: 30_000 });
          assert.equal(await rival.forceRelease(forced), true);
          assert.equal(redis.cli('-n', '4', 'EXISTS', forced), '0');
          await (await plain.acquire(unique('plain'), { ttl: 1000 })).release();
          // After the server drops the connections, the reconnected ones are in database 4 too.
          redis.cli('CLIENT', 'KILL', 'TYPE', 'normal');
          const again = unique('again');
          let taken;
          for (let i = 0; i < 20 && taken === undefined; i++) {
            taken = await holder.acquire(again, { ttl: 30_000 }).catch(() => undefined);
          }
          assert.ok(taken, 'the adapter reconnected');
          assert.equal(redis.cli('-n', '4', 'EXISTS', again), '1');
          assert.equal(redis.cli('-n', '0', 'EXISTS', again), '0');
          await taken.release();
          assert.equal(await lock.release(), true);
          assert.equal(redis.cli('-n', '4', 'EXISTS', key), '0');
        } finally {
          for (const adapter of adapters) await adapter.close();
        }
      });
    }
  }

  it('a database the server does not have is a BackendError at first use', async () => {
    const adapter = new RedisAdapter({ url: `${redis.url}/99` });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    await assert.rejects(locker.acquire(unique('99'), { ttl: 1000 }), (e) => e.code === 'LOCK_BACKEND' && /DB index/i.test(e.message));
    await adapter.close();
  });
});

describe("a Redlock URL's database", { skip: ownServer }, () => {
  let servers;
  before(async () => {
    servers = await Promise.all([0, 1, 2].map(() => startRedis()));
  });
  after(() => Promise.all((servers ?? []).map((s) => s.dispose())));

  it('each server keeps the lock in the database its URL names', async () => {
    const adapter = new RedlockAdapter({ urls: servers.map((s, i) => (i === 1 ? `${s.url}?db=2` : `${s.url}/2`)) });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    const key = unique('redlock');
    const lock = await locker.acquire(key, { ttl: 30_000 });
    for (const s of servers) {
      assert.equal(s.cli('-n', '2', 'EXISTS', key), '1');
      assert.equal(s.cli('-n', '0', 'EXISTS', key), '0');
    }
    assert.equal((await locker.inspect(key)).held, true);
    await lock.release();
    await adapter.close();
  });
});

describe('an accepted parameter still connects', () => {
  it('PostgreSQL: application_name, sslmode=disable and keepalives', async () => {
    const pg = await startPostgres();
    try {
      const url = `${pg.url}${pg.url.includes('?') ? '&' : '?'}application_name=locco-urls&sslmode=disable&keepalives_idle=30`;
      const adapter = new PostgresAdapter({ url, tableName: 'urls_locks' });
      const locker = new Locker({ adapter, retry: { retries: 0 } });
      const lock = await locker.acquire(unique('pg'), { ttl: 5000 });
      assert.ok(Number(pg.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'locco-urls'")) >= 1);
      assert.equal(await lock.release(), true);
      await adapter.close();
    } finally {
      await pg.dispose();
    }
  });

  it('MongoDB: appName and maxPoolSize', async () => {
    const mongo = await startMongo();
    try {
      const url = `${mongo.url}${mongo.url.includes('?') ? '&' : '?'}appName=locco-urls&maxPoolSize=4`;
      const adapter = new MongoAdapter({ url, dbName: 'urls' });
      const locker = new Locker({ adapter, retry: { retries: 0 } });
      const lock = await locker.acquire(unique('mongo'), { ttl: 5000 });
      assert.equal(await lock.release(), true);
      await adapter.close();
    } finally {
      await mongo.dispose();
    }
  });
});
