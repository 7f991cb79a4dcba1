// A backend that cannot be reached, the same on every networked backend: by default the failure
// ends the acquisition as a BackendError (never contention), at once or within the adapter's
// connect timeout; with `retry: { onBackendError: 'retry' }` it is one more try, each reported
// as a `backendRetry` event, and the acquisition takes the key once the server answers again,
// within its budget. A loopback proxy in front of each real server refuses connections while
// it is cut.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { BackendError, Locker, LockHeldError, ValidationError } from 'locco-rs';
import { RedisAdapter } from 'locco-rs/redis';
import { PostgresAdapter } from 'locco-rs/postgres';
import { MongoAdapter } from 'locco-rs/mongo';
import { EtcdAdapter } from 'locco-rs/etcd';
import { sleep } from '../support/adapters.mjs';
import { startEtcd, startMongo, startPostgres, startRedis, testProxy } from '../support/servers.mjs';

const CONNECT_MS = 1000;

const BACKENDS = [
  { name: 'Redis', start: startRedis, adapter: (url) => new RedisAdapter({ url, connectTimeout: CONNECT_MS, commandTimeout: CONNECT_MS }) },
  { name: 'PostgreSQL', start: startPostgres, adapter: (url) => new PostgresAdapter({ url, connectTimeout: CONNECT_MS }) },
  { name: 'MongoDB', start: startMongo, adapter: (url) => new MongoAdapter({ url, connectTimeout: CONNECT_MS }) },
  {
    name: 'etcd',
    start: startEtcd,
    // An endpoint is host:port, without the path a URL gets.
    adapter: (url) => new EtcdAdapter({ endpoints: [new URL(url).host], connectTimeout: CONNECT_MS, requestTimeout: CONNECT_MS }),
  },
];

for (const backend of BACKENDS) {
  describe(`an unreachable backend: ${backend.name}`, () => {
    let server;
    let proxy;
    let adapter;
    let keys = 0;
    const key = () => `unreachable:${++keys}:${process.pid}`;

    before(async () => {
      server = await backend.start();
      const url = server.url ?? server.endpoint;
      proxy = await testProxy(Number(new URL(url).port));
      adapter = backend.adapter(proxy.urlFor(url));
      // Connected once, so that what follows is an outage, not a first connection.
      await (await new Locker({ adapter }).acquire(key(), { ttl: 5000 })).release();
    });
    after(async () => {
      await proxy?.close();
      await adapter?.close?.();
      await server?.dispose();
    });

    it('by default the failure ends the acquisition: a BackendError within the connect timeout, not contention', async () => {
      await proxy.cut();
      try {
        const events = [];
        const locker = new Locker({ adapter, onEvent: (e) => events.push(e.type) });
        const started = performance.now();
        const err = await locker.acquire(key(), { ttl: 5000, retry: { retries: 100, delay: 100, timeout: 20_000 } }).catch((e) => e);
        const took = performance.now() - started;
        assert.ok(err instanceof BackendError, `expected a BackendError, got ${err}`);
        assert.ok(!(err instanceof LockHeldError));
        assert.ok(['io', 'timeout'].includes(err.kind), err.kind);
        assert.ok(took < CONNECT_MS * 4, `ended after ${took.toFixed(0)} ms, not within the connect timeout`);
        assert.ok(!events.includes('backendRetry'), events.join());
      } finally {
        await proxy.restore();
      }
    });

    it("with onBackendError: 'retry' the acquisition rides out the outage and takes the key once the server answers", async () => {
      await proxy.cut();
      const retried = [];
      const locker = new Locker({ adapter, onEvent: (e) => e.type === 'backendRetry' && retried.push(e) });
      const k = key();
      const pending = locker.acquire(k, { ttl: 5000, retry: { retries: Infinity, delay: 100, timeout: 30_000, onBackendError: 'retry' } });
      let settled = false;
      pending.then(
        () => (settled = true),
        () => (settled = true),
      );
      await sleep(CONNECT_MS * 2.5);
      assert.equal(settled, false, 'the acquisition ended during the outage');
      await proxy.restore();
      const lock = await pending;
      assert.equal(lock.state, 'held');
      assert.ok(retried.length >= 1, 'no backendRetry event');
      for (const e of retried) {
        assert.equal(e.key, k);
        assert.ok(e.error instanceof BackendError, String(e.error));
        assert.ok(e.attempt >= 1 && e.elapsedMs >= 0);
      }
      // Only this holder has the key: no grant of a failed attempt was left behind.
      assert.equal(await new Locker({ adapter }).tryAcquire(k, { ttl: 1000 }), null);
      assert.equal(await lock.release(), true);
      assert.notEqual(await new Locker({ adapter }).tryAcquire(k, { ttl: 1000 }), null);
    });

    it('the budget still bounds it: the last backend failure is the answer when the time is spent', async () => {
      await proxy.cut();
      try {
        const locker = new Locker({ adapter });
        const started = performance.now();
        const err = await locker.acquire(key(), { ttl: 5000, retry: { retries: Infinity, delay: 100, timeout: 2500, onBackendError: 'retry' } }).catch((e) => e);
        const took = performance.now() - started;
        assert.ok(err instanceof BackendError, `expected a BackendError, got ${err}`);
        assert.ok(took >= 2000 && took < 2500 + CONNECT_MS * 4, `ended after ${took.toFixed(0)} ms`);
      } finally {
        await proxy.restore();
      }
    });
  });
}

describe('retry.onBackendError', () => {
  it('takes fail or retry, and names the field otherwise', async () => {
    const { InMemoryAdapter } = await import('locco-rs/memory');
    const locker = new Locker({ adapter: new InMemoryAdapter(), retry: { onBackendError: 'retry' } });
    await (await locker.acquire('k', { ttl: 1000, retry: { onBackendError: 'fail' } })).release();
    assert.throws(
      () => new Locker({ adapter: new InMemoryAdapter(), retry: { onBackendError: 'sometimes' } }),
      (e) => e instanceof ValidationError && e.field === 'retry.onBackendError',
    );
    await assert.rejects(locker.acquire('k', { ttl: 1000, retry: { onBackendError: true } }), (e) => e instanceof ValidationError && e.field === 'retry.onBackendError');
  });
});
