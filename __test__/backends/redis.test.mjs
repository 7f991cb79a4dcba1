import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { BackendError, Locker, LockHeldError, ValidationError } from 'locco-rs';
import { RedisAdapter, RedisReplicationError } from 'locco-rs/redis';
import { freePort, makeTestCertificates, redisIsExternal, startRedis, startRedisCluster, testProxy } from '../support/servers.mjs';
import { sleep, until } from '../support/adapters.mjs';

// With LOCCO_TEST_REDIS_URL (a server this process did not start, e.g. for node.exe under Wine,
// which cannot spawn Linux programs) a test that restarts or pauses the server, or needs a
// server with flags, TLS, replicas or a cluster, is skipped: those need a server of its own.
const ownServer = redisIsExternal() && 'needs a Redis server of its own (LOCCO_TEST_REDIS_URL names a shared one)';

describe('RedisAdapter faults', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis.dispose());

  it('keeps a heartbeat going through a server restart', { skip: ownServer }, async () => {
    const adapter = new RedisAdapter({ url: redis.url, commandTimeout: 500 });
    const events = [];
    const locker = new Locker({ adapter, onEvent: (e) => events.push(e) });
    const lock = await locker.acquire('restart', { ttl: 3000, autoExtend: { maxHold: 60_000 } });
    await redis.restart();
    // The restarted server has lost the key (no persistence): an extension then finds it gone
    // and the lock ends 'extend'; or extensions threw while it was down and it ends when the
    // lease runs out. Either way the lock reports the loss, and nothing hangs.
    await until(() => lock.state === 'lost', 10_000);
    assert.ok(['extend', 'extend-failed', 'late-extend', 'expired'].includes(lock.lostReason), lock.lostReason);
    // Reconnected without user action.
    const again = await locker.acquire('restart', { ttl: 1000, retry: { retries: 20, delay: 100 } });
    assert.equal(again.state, 'held');
    await again.release();
  });

  it('a connection the server closed costs no CPU while idle, and the next operation reconnects', async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }), retry: { retries: 0 } });
    await (await locker.acquire('closed:warm', { ttl: 5000 })).release();
    redis.cli('CLIENT', 'KILL', 'TYPE', 'normal');
    await sleep(200);
    // A socket at end of file stays readable: a watch left on it after the connection ended
    // would wake the loop on every turn.
    const before = process.cpuUsage();
    const started = performance.now();
    await sleep(1000);
    const used = process.cpuUsage(before);
    const share = (used.user + used.system) / 1000 / (performance.now() - started);
    assert.ok(share < 0.2, `an idle process used ${(share * 100).toFixed(0)}% of a core`);
    const lock = await locker.tryAcquire('closed:after', { ttl: 5000 });
    assert.ok(lock, 'the key was free');
    assert.equal(await lock.release(), true);
  });

  // LOCCO_REDIS_PORTABLE=1: the driver's own connection on the I/O thread, which is what
  // platforms without the event-loop link (Windows) get.
  const portableAdapter = (options) => {
    const was = process.env.LOCCO_REDIS_PORTABLE;
    process.env.LOCCO_REDIS_PORTABLE = '1';
    try {
      return new RedisAdapter(options);
    } finally {
      if (was === undefined) delete process.env.LOCCO_REDIS_PORTABLE;
      else process.env.LOCCO_REDIS_PORTABLE = was;
    }
  };

  it('on the portable connection, the next operation after the server closed the connection succeeds', async () => {
    const adapter = portableAdapter({ url: redis.url });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    try {
      await (await locker.acquire('portable:warm', { ttl: 5000 })).release();
      redis.cli('CLIENT', 'KILL', 'TYPE', 'normal');
      await sleep(200);
      const lock = await locker.tryAcquire('portable:after', { ttl: 5000 });
      assert.ok(lock, 'the key was free');
      assert.equal(await lock.release(), true);
    } finally {
      await adapter.close();
    }
  });

  it('on the portable connection, the next operation after the server timed out the idle connection succeeds', { skip: ownServer }, async () => {
    const adapter = portableAdapter({ url: redis.url });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    redis.cli('CONFIG', 'SET', 'timeout', '1');
    try {
      await (await locker.acquire('portable:idle-warm', { ttl: 5000 })).release();
      // The server closes a connection idle for more than a second, checked a few times a second.
      await sleep(2500);
      // Each reading is a connection of its own, counted before it reads.
      const received = () => Number(/total_connections_received:(\d+)/.exec(redis.cli('INFO', 'stats'))[1]);
      const before = received();
      const lock = await locker.tryAcquire('portable:idle-after', { ttl: 5000 });
      assert.ok(lock, 'the key was free');
      assert.equal(await lock.release(), true);
      assert.ok(received() - before >= 2, 'the server had closed the idle connection');
    } finally {
      redis.cli('CONFIG', 'SET', 'timeout', '0');
      await adapter.close();
    }
  });

  // The driver answers "broken pipe" for a request in flight too, which the server may have
  // run: such a request fails, and is not sent again (a second SET NX would find the key its
  // first run set, and answer that someone else holds it).
  it('on the portable connection, a request in flight when the connection dies fails and is not sent again', { skip: ownServer }, async () => {
    const proxy = await testProxy(redis.port);
    const adapter = portableAdapter({ url: proxy.urlFor(redis.url), commandTimeout: 10_000 });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    try {
      await (await locker.acquire('portable:flight-warm', { ttl: 5000 })).release();
      const sets = redis.calls('set');
      redis.pause();
      let answer;
      try {
        answer = locker.tryAcquire('portable:flight', { ttl: 10_000 }).then((lock) => lock, (e) => e);
        await sleep(300); // the request waits in the stopped server's socket
        await proxy.cut();
      } finally {
        redis.resume();
      }
      // The server runs the request it had received; then a connection may be made again.
      await until(() => redis.calls('set') === sets + 1, 5000);
      await proxy.restore();
      const err = await answer;
      assert.ok(err instanceof BackendError, `a lost answer is a BackendError, not ${err}`);
      await sleep(1500);
      assert.equal(redis.calls('set'), sets + 1, 'the request was sent once');
      const lock = await locker.tryAcquire('portable:flight-after', { ttl: 5000 });
      assert.ok(lock, 'the next operation connects again');
      await lock.release();
    } finally {
      await adapter.close();
      await proxy.close();
    }
  });

  it('requests waiting on a stopped server cost no CPU: the busy-poll for an answer is bounded', { skip: ownServer }, async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url, commandTimeout: 10_000 }), retry: { retries: 0 } });
    await (await locker.acquire('spin:warm', { ttl: 5000 })).release();
    redis.pause();
    try {
      // One request sent right after an answer (which lets the loop poll for the next), then
      // a steady trickle: the loop may poll a little after a write while an answer could be
      // near, but not for as long as answers stay away.
      const pending = [locker.tryAcquire('spin:0', { ttl: 8000 }).catch((e) => e)];
      const before = process.cpuUsage();
      const started = performance.now();
      for (let i = 1; i <= 20; i++) {
        await sleep(50);
        pending.push(locker.tryAcquire(`spin:${i}`, { ttl: 8000 }).catch((e) => e));
      }
      const used = process.cpuUsage(before);
      const share = (used.user + used.system) / 1000 / (performance.now() - started);
      assert.ok(share < 0.25, `waiting on a stopped server used ${(share * 100).toFixed(0)}% of a core`);
      redis.resume();
      for (const lock of await Promise.all(pending)) {
        assert.ok(lock && typeof lock.release === 'function', `an answer came once the server ran: ${lock}`);
        await lock.release();
      }
    } finally {
      redis.resume();
    }
  });

  it('a stopped server gives a timeout BackendError and late-extend, not a hang', { skip: ownServer }, async () => {
    const adapter = new RedisAdapter({ url: redis.url });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    const lock = await locker.acquire('paused', { ttl: 600, autoExtend: { maxHold: 60_000 } });
    await locker.tryAcquire('warm', { ttl: 600 }); // the connection is up
    redis.pause();
    try {
      const started = performance.now();
      const err = await locker.tryAcquire('other', { ttl: 300 }).catch((e) => e);
      assert.ok(err instanceof BackendError, String(err));
      assert.equal(err.kind, 'timeout');
      assert.ok(performance.now() - started < 2000);
      await until(() => lock.state === 'lost', 5000);
      assert.equal(lock.lostReason, 'late-extend');
    } finally {
      redis.resume();
    }
  });

  it('a release to a stopped server fails with a timeout after commandTimeout, then reconnects', { skip: ownServer }, async () => {
    const adapter = new RedisAdapter({ url: redis.url, commandTimeout: 400 });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    const lock = await locker.acquire('stalled', { ttl: 10_000 });
    redis.pause();
    let err;
    const started = performance.now();
    try {
      err = await lock.release().catch((e) => e);
    } finally {
      redis.resume();
    }
    const took = performance.now() - started;
    assert.ok(err instanceof BackendError, String(err));
    assert.equal(err.kind, 'timeout');
    assert.match(err.message, /commandTimeout/);
    assert.ok(took >= 350 && took < 3000, `failed after ${took} ms`);
    // A command that timed out may still run when the server wakes, so the retry may find
    // the key gone; either way it answers, over a new connection.
    assert.equal(typeof (await lock.release()), 'boolean');
    const again = await locker.acquire('stalled', { ttl: 10_000, retry: { retries: 20, delay: 100 } });
    assert.equal(await again.release(), true);
  });

  it('a JavaScript stall longer than commandTimeout fails no request: the server was not at fault', async () => {
    const adapter = new RedisAdapter({ url: redis.url, commandTimeout: 300 });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    await (await locker.acquire('stall:warm', { ttl: 1000 })).release();
    // Many requests at once: the last of them are still queued when the loop turns to the
    // timer below, which blocks it three times the command timeout. The server answers the
    // rest meanwhile, unread. Counting that stall against the server shut the connection and
    // failed the requests still waiting (18 to 30 of them here).
    const pending = Promise.allSettled(Array.from({ length: 20_000 }, (_, i) => locker.tryAcquire(`stall:${i}`, { ttl: 60_000 })));
    await new Promise((r) => setTimeout(r, 0));
    const end = performance.now() + 900;
    while (performance.now() < end) {
      // A long synchronous task.
    }
    const results = await pending;
    const failed = results.filter((r) => r.status === 'rejected').map((r) => r.reason.message);
    assert.deepEqual(failed.slice(0, 3), [], `${failed.length} requests failed`);
    assert.ok(results.every((r) => r.value !== null), 'every key was free and granted');
    await Promise.all(results.map((r) => r.value.release()));
  });

  it('matches every answer to its request when hundreds share the connection', async () => {
    // 800 requests in one turn are written in several early 8 KiB batches.
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }), retry: { retries: 0 } });
    const keys = Array.from({ length: 400 }, (_, i) => `crowd:${i}:${'x'.repeat(i % 50)}`);
    const tries = await Promise.all(keys.flatMap((k) => [locker.tryAcquire(k, { ttl: 10_000 }), locker.tryAcquire(k, { ttl: 10_000 })]));
    const won = tries.filter((l) => l !== null);
    assert.equal(won.length, keys.length, 'exactly one grant per key');
    assert.deepEqual(new Set(won.map((l) => l.key)), new Set(keys));
    for (const lock of won.filter((_, i) => i % 40 === 0)) assert.equal(redis.cli('GET', lock.key), lock.token);
    assert.deepEqual(await Promise.all(won.map((l) => l.release())), won.map(() => true));
  });

  it('writes a burst larger than the socket buffer, waiting for room', async () => {
    // About 18 MB of requests in one turn: more than the kernel takes at once.
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }), retry: { retries: 0 } });
    const keys = Array.from({ length: 6000 }, (_, i) => `burst:${i}:${'k'.repeat(3000)}`);
    const locks = await Promise.all(keys.map((k) => locker.tryAcquire(k, { ttl: 30_000 })));
    assert.equal(locks.filter((l) => l !== null).length, keys.length);
    const released = await Promise.all(locks.map((l) => l.release()));
    assert.equal(released.filter(Boolean).length, keys.length);
  });

  it('fencing tokens keep growing after FLUSHALL', async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }), fencing: true });
    const first = await locker.acquire('fenced', { ttl: 5000 });
    redis.cli('FLUSHALL');
    const second = await locker.acquire('fenced', { ttl: 5000 });
    assert.ok(second.fence > first.fence, `${second.fence} > ${first.fence}`);
    assert.ok(second.fence < 2 ** 53);
    assert.equal(redis.cli('PTTL', '{fenced}:locco-fence') > 86_000_000, true);
  });

  it('an attempt given up while its connection comes up leaves no grant behind its give-back', async () => {
    // A clock that jumps a whole lease per reading: the attempt is out of time while the
    // fresh adapter still connects. An attempt waits one tick for an answer on its way, so its
    // SET may leave in that tick; then the grant is given back once its answer arrives. A SET
    // that leaves after the give-back would leave the key held.
    let t = 0;
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }), now: () => (t += 1000) });
    // Out of time with no answer: a timeout; with the answer in that tick, but after the lease
    // could have ended on this clock: a late grant. Given back either way.
    const givenUp = (e) => (e instanceof BackendError && e.kind === 'timeout') || (e instanceof LockHeldError && e.reason === 'late-acquire');
    const err = await locker.tryAcquire('given-up', { ttl: 1000 }).catch((e) => e);
    assert.ok(givenUp(err), String(err));
    await sleep(300); // the give-back, and anything else still due
    assert.equal(redis.cli('EXISTS', 'given-up'), '0');
    // The same for a fenced grant (a script; a fencing token it took is a gap, not a grant).
    const fenced = new Locker({ adapter: new RedisAdapter({ url: redis.url }), fencing: true, now: () => (t += 1000) });
    const late = await fenced.tryAcquire('given-up-fenced', { ttl: 1000 }).catch((e) => e);
    assert.ok(givenUp(late), String(late));
    await sleep(300);
    assert.equal(redis.cli('EXISTS', 'given-up-fenced'), '0');
  });

  it('runs its scripts again after SCRIPT FLUSH (NOSCRIPT falls back to EVAL)', async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }) });
    const lock = await locker.acquire('noscript', { ttl: 5000 });
    redis.cli('SCRIPT', 'FLUSH');
    assert.equal(await lock.isHeld(), true);
    assert.equal(await lock.release(), true);
  });

  it('a server out of memory (noeviction) refuses new grants with a BackendError; held locks renew and release', async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }), retry: { retries: 2, delay: 20 } });
    const fenced = new Locker({ adapter: new RedisAdapter({ url: redis.url }), fencing: true, retry: { retries: 0 } });
    // A lease long enough that the synchronous redis.cli() calls below (a child process each;
    // about a second apiece under Wine) never hold the event loop past an extension's due time.
    const held = await locker.acquire('oom:held', { ttl: 4000, autoExtend: { maxHold: 60_000 } });
    redis.cli('CONFIG', 'SET', 'maxmemory', '1');
    try {
      for (const [who, key] of [[locker, 'oom:new'], [fenced, 'oom:fenced']]) {
        const err = await who.acquire(key, { ttl: 1000 }).catch((e) => e);
        // The server's own refusal, not a reply the client failed to read.
        assert.ok(err instanceof BackendError, `${key}: ${err}`);
        assert.equal(err.serverCode, 'OOM', `${key}: ${err}`);
        assert.equal(err.kind, 'other', `${key}: ${err}`);
        assert.match(err.message, /maxmemory/, key);
        assert.equal(redis.cli('EXISTS', key, `{${key}}:locco-fence`), '0', key);
      }
      // PEXPIREAT and DEL are allowed when memory is full: nothing held is lost for it.
      await sleep(4500);
      assert.equal(held.state, 'held', held.lostReason);
      assert.equal(await held.release(), true);
    } finally {
      redis.cli('CONFIG', 'SET', 'maxmemory', '0');
    }
    const again = await locker.acquire('oom:new', { ttl: 1000 });
    await again.release();
  });

  it('warns before the first grant, even when an acquire follows the constructor at once (20 adapters)', async () => {
    redis.cli('CONFIG', 'SET', 'maxmemory-policy', 'volatile-lru');
    const order = [];
    const onWarning = (w) => {
      if (w.code === 'LOCCO_REDIS_EVICTION') order.push('warning');
    };
    process.on('warning', onWarning);
    try {
      for (let i = 0; i < 20; i++) {
        order.length = 0;
        const adapter = new RedisAdapter({ url: redis.url });
        const lock = await new Locker({ adapter }).acquire(`warned:${i}`, { ttl: 1000 });
        order.push('granted');
        assert.deepEqual(order, ['warning', 'granted'], `adapter ${i}`);
        await lock.release();
        await adapter.close();
      }
    } finally {
      process.off('warning', onWarning);
      redis.cli('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
    }
  });

  it('warns once when maxmemory-policy may evict lock keys', async () => {
    redis.cli('CONFIG', 'SET', 'maxmemory-policy', 'allkeys-lru');
    const warnings = [];
    const onWarning = (w) => warnings.push(w);
    process.on('warning', onWarning);
    try {
      const adapter = new RedisAdapter({ url: redis.url });
      await until(() => warnings.length > 0, 5000);
      assert.match(warnings[0].message, /allkeys-lru.*noeviction/s);
      await adapter.close();
    } finally {
      process.off('warning', onWarning);
      redis.cli('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
    }
  });
});

describe('RedisAdapter connection failures', { skip: ownServer }, () => {
  let redis;
  before(async () => {
    redis = await startRedis({ args: ['--aclfile', '/dev/null'] });
    redis.cli('ACL', 'SETUSER', 'locker', 'on', '>s3cret-pw', '~*', '+@all');
  });
  after(() => redis.dispose());

  it('works as an ACL user with a password', async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: `redis://locker:s3cret-pw@127.0.0.1:${redis.port}` }) });
    const lock = await locker.acquire('acl', { ttl: 1000 });
    assert.equal(await lock.release(), true);
  });

  it('a wrong password is an auth BackendError without the password', async () => {
    const adapter = new RedisAdapter({ url: `redis://locker:wrong-pw@127.0.0.1:${redis.port}`, connectTimeout: 2000 });
    const err = await new Locker({ adapter }).tryAcquire('x', { ttl: 1000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.equal(err.backend, 'redis');
    assert.equal(err.kind, 'auth');
    assert.doesNotMatch(`${err.message} ${err.stack}`, /wrong-pw/);
  });

  it('a server that wants a password and got none is an auth BackendError (NOAUTH)', async () => {
    const guarded = await startRedis({ args: ['--requirepass', 'p4ss-word'] });
    try {
      const adapter = new RedisAdapter({ url: guarded.url, connectTimeout: 2000 });
      const err = await new Locker({ adapter }).tryAcquire('x', { ttl: 1000 }).catch((e) => e);
      await adapter.close();
      assert.equal(err.code, 'LOCK_BACKEND', String(err));
      assert.equal(err.kind, 'auth', err.message);
      assert.match(err.message, /NOAUTH/);
    } finally {
      await guarded.dispose();
    }
  });

  it('a port that answers HTTP says so', async () => {
    const web = createServer((_, res) => res.end('not redis'));
    await new Promise((resolve) => web.listen(0, '127.0.0.1', resolve));
    try {
      const adapter = new RedisAdapter({ url: `redis://127.0.0.1:${web.address().port}`, connectTimeout: 2000 });
      const err = await new Locker({ adapter }).tryAcquire('x', { ttl: 1000 }).catch((e) => e);
      await adapter.close();
      assert.equal(err.code, 'LOCK_BACKEND', String(err));
      assert.equal(err.kind, 'protocol', err.message);
      assert.match(err.message, /answered HTTP/);
    } finally {
      web.close();
    }
  });

  it('an unreachable host is an io BackendError within the connect timeout', async () => {
    const port = await freePort();
    const started = performance.now();
    const adapter = new RedisAdapter({ url: `redis://user:pw-123@127.0.0.1:${port}`, connectTimeout: 1000 });
    const err = await new Locker({ adapter }).tryAcquire('x', { ttl: 1000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.ok(['io', 'timeout'].includes(err.kind), err.kind);
    assert.ok(performance.now() - started < 3000);
    assert.doesNotMatch(err.message, /pw-123/);
  });

  it('refuses bad options before connecting', () => {
    assert.throws(() => new RedisAdapter({}), ValidationError);
    assert.throws(() => new RedisAdapter({ url: 'http://x' }), ValidationError);
    assert.throws(() => new RedisAdapter({ urls: ['redis://a', 'redis://b'] }), ValidationError);
    assert.throws(
      () => new RedisAdapter({ urls: ['redis://127.0.0.1:1'], cluster: true, waitForReplicas: { replicas: 1, timeout: 10 } }),
      (e) => e instanceof ValidationError && e.field === 'waitForReplicas',
    );
  });
});

describe('RedisAdapter over TLS', { skip: ownServer }, () => {
  let redis;
  let ca;
  before(async () => {
    const certs = makeTestCertificates();
    ca = certs.ca;
    const tlsPort = await freePort();
    redis = await startRedis({
      tlsPort,
      args: ['--tls-cert-file', certs.certFile, '--tls-key-file', certs.keyFile, '--tls-auth-clients', 'no'],
    });
  });
  after(() => redis.dispose());

  it('locks through rediss:// with a CA', async () => {
    const adapter = new RedisAdapter({ url: `rediss://localhost:${redis.port}`, tls: { ca } });
    const lock = await new Locker({ adapter }).acquire('tls', { ttl: 1000 });
    assert.equal(await lock.release(), true);
  });

  it('a TLS mismatch is a BackendError, promptly', async () => {
    const started = performance.now();
    const plain = new RedisAdapter({ url: `redis://127.0.0.1:${redis.port}`, connectTimeout: 1500, commandTimeout: 1500 });
    const err = await new Locker({ adapter: plain }).tryAcquire('x', { ttl: 1000 }).catch((e) => e);
    assert.equal(err.code, 'LOCK_BACKEND', String(err));
    assert.ok(['tls', 'io', 'timeout', 'protocol'].includes(err.kind), err.kind);
    const untrusted = new RedisAdapter({ url: `rediss://localhost:${redis.port}`, connectTimeout: 1500 });
    const err2 = await new Locker({ adapter: untrusted }).tryAcquire('x', { ttl: 1000 }).catch((e) => e);
    assert.equal(err2.code, 'LOCK_BACKEND', String(err2));
    assert.equal(err2.kind, 'tls');
    assert.ok(performance.now() - started < 5000);
  });
});

describe('RedisAdapter waitForReplicas', { skip: ownServer }, () => {
  let primary;
  let replica;
  before(async () => {
    primary = await startRedis({ args: ['--repl-diskless-sync-delay', '0'] });
    replica = await startRedis({ args: ['--replicaof', '127.0.0.1', String(primary.port)] });
    await until(() => /slave0:.*state=online/.test(primary.cli('INFO', 'replication')), 20_000);
  });
  after(async () => {
    await replica.dispose();
    await primary.dispose();
  });

  it('grants once a replica has the write', async () => {
    const adapter = new RedisAdapter({ url: primary.url, waitForReplicas: { replicas: 1, timeout: 1000 } });
    const locker = new Locker({ adapter, fencing: true });
    const lock = await locker.acquire('wait', { ttl: 5000 });
    await until(() => replica.cli('GET', 'wait') === lock.token, 2000);
    await lock.extend(5000);
    assert.equal(await lock.release(), true);
  });

  it('an adapter pointed at a replica fails with READONLY, never with contention', async () => {
    const replicaLocker = new Locker({ adapter: new RedisAdapter({ url: replica.url }), retry: { retries: 0 } });
    const fenced = new Locker({ adapter: new RedisAdapter({ url: replica.url }), fencing: true, retry: { retries: 0 } });
    for (const who of [replicaLocker, fenced]) {
      const err = await who.acquire('on-replica', { ttl: 1000 }).catch((e) => e);
      assert.ok(err instanceof BackendError, String(err));
      assert.equal(err.serverCode, 'READONLY', String(err));
    }
  });

  it('an attempt given up before its connection was up sends nothing, so no grant lands after its give-back', async () => {
    // As without waitForReplicas (see above), on the path that waits for the replica, whose
    // connection is made on the I/O thread: the first connection takes 2 s, the lease 1 s, so
    // the attempt is out of time while the fresh adapter still connects, and its write must not
    // go out after the release. (A clock that jumps a lease per reading, as above, raced with
    // that thread: on a busy machine the connection was up before the engine gave up.)
    const sets = () => primary.calls('set');
    const proxy = await testProxy(Number(new URL(primary.url).port), { delay: 2000 });
    const url = proxy.urlFor(primary.url);
    try {
      for (const fencing of [false, true]) {
        const key = `wait-given-up-${fencing}`;
        const before = sets();
        const adapter = new RedisAdapter({ url, waitForReplicas: { replicas: 1, timeout: 1000 } });
        const locker = new Locker({ adapter, fencing, retry: { retries: 0 } });
        const err = await locker.tryAcquire(key, { ttl: 1000 }).catch((e) => e);
        assert.ok(err instanceof BackendError && err.kind === 'timeout', String(err));
        await sleep(2500); // the connection, the give-back, and anything else still due
        assert.equal(sets(), before, `fencing ${fencing}: no SET reached the server`);
        assert.equal(primary.cli('EXISTS', key, `{${key}}:locco-fence`), '0', `fencing ${fencing}`);
        await adapter.close();
      }
    } finally {
      await proxy.close();
    }
  });

  // Writes that wait for replicas go out on connections of their own, kept for the next write.
  it('the next write after the server closed the idle connections succeeds', async () => {
    const adapter = new RedisAdapter({ url: primary.url, waitForReplicas: { replicas: 1, timeout: 1000 } });
    const locker = new Locker({ adapter, retry: { retries: 0 } });
    try {
      await (await locker.acquire('wait-closed:warm', { ttl: 5000 })).release();
      primary.cli('CLIENT', 'KILL', 'TYPE', 'normal');
      await sleep(200);
      const lock = await locker.tryAcquire('wait-closed:after', { ttl: 5000 });
      assert.ok(lock, 'the key was free');
      await lock.extend(5000);
      assert.equal(await lock.release(), true);
    } finally {
      await adapter.close();
    }
  });

  it('a WAIT in progress holds up no other lock', async () => {
    const adapter = new RedisAdapter({ url: primary.url, waitForReplicas: { replicas: 1, timeout: 2000 } });
    const locker = new Locker({ adapter });
    const other = await locker.acquire('not-waiting', { ttl: 10_000 });
    replica.pause();
    try {
      const waiting = locker.tryAcquire('waits', { ttl: 10_000 }).catch((e) => e);
      await sleep(50); // the write and its WAIT are in flight
      const started = performance.now();
      assert.equal(await other.isHeld(), true);
      assert.ok(performance.now() - started < 1000, 'isHeld did not queue behind the WAIT');
      assert.ok((await waiting) instanceof RedisReplicationError);
    } finally {
      replica.resume();
    }
    await other.release();
  });

  it('throws RedisReplicationError and gives the key back when the replica is gone', async () => {
    const adapter = new RedisAdapter({ url: primary.url, waitForReplicas: { replicas: 1, timeout: 200 } });
    const events = [];
    const locker = new Locker({ adapter, onEvent: (e) => events.push(e) });
    const held = await locker.acquire('repl', { ttl: 5000, autoExtend: { maxHold: 60_000, interval: 1000 } });
    replica.pause();
    try {
      const err = await locker.tryAcquire('repl-2', { ttl: 5000 }).catch((e) => e);
      assert.ok(err instanceof RedisReplicationError, String(err));
      assert.equal(err.replicas, 1);
      assert.equal(err.acknowledged, 0);
      assert.equal(primary.cli('EXISTS', 'repl-2'), '0', 'the key was given back');
      // An extension that cannot be replicated keeps the lock and reports extendFailed.
      await until(() => events.some((e) => e.type === 'extendFailed'), 5000);
      assert.equal(held.state, 'held');
      assert.ok(events.find((e) => e.type === 'extendFailed').error instanceof RedisReplicationError);
    } finally {
      replica.resume();
    }
  });
});

/**
 * The hash slot of `key` (which must exist) on a Cluster's `nodes`: the master that has it,
 * another node, its keys, and its move to that other node (a master), step by step.
 */
function slotOf(nodes, key) {
  const slot = nodes[0].cli('CLUSTER', 'KEYSLOT', key);
  // A replica has the slot's keys too.
  const owner = nodes.find((n) => n.cli('CLUSTER', 'COUNTKEYSINSLOT', slot) !== '0' && n.cli('INFO', 'replication').includes('role:master'));
  const target = nodes.find((n) => n !== owner);
  const targetId = target.cli('CLUSTER', 'MYID');
  return {
    owner,
    target,
    keys: () => owner.cli('CLUSTER', 'GETKEYSINSLOT', slot, '10').split('\n').filter(Boolean),
    /** Marks the slot as moving: a request for keys not on the owner any more is sent on (ASK). */
    beginMove() {
      target.cli('CLUSTER', 'SETSLOT', slot, 'IMPORTING', owner.cli('CLUSTER', 'MYID'));
      owner.cli('CLUSTER', 'SETSLOT', slot, 'MIGRATING', targetId);
    },
    moveKeys: (keys) => owner.cli('MIGRATE', '127.0.0.1', String(target.port), '', '0', '5000', 'KEYS', ...keys),
    /** The slot is the target's, on every node (MOVED). */
    endMove() {
      for (const n of nodes) n.cli('CLUSTER', 'SETSLOT', slot, 'NODE', targetId);
    },
  };
}

describe('RedisAdapter on a Cluster with replicas', { skip: ownServer }, () => {
  let cluster;
  before(async () => {
    cluster = await startRedisCluster({ size: 3, replicas: 1, args: ['--cluster-node-timeout', '1000'] });
  });
  after(async () => {
    await cluster?.dispose();
  });

  // A failover within the lease's slack: a renewal that falls due while the master is gone
  // may fail (extendFailed, retried), never loses the lock; once the replica has taken over
  // (with the key, which it had, and without the scripts, which are not replicated) the
  // renewals go on there.
  it('a held lock survives the failover of its master to the replica', async () => {
    const adapter = new RedisAdapter({ urls: cluster.urls, cluster: true });
    const seen = [];
    const locker = new Locker({ adapter, onEvent: (e) => seen.push(e.type) });
    const key = 'failing-over';
    const lock = await locker.acquire(key, { ttl: 10_000, autoExtend: { maxHold: 120_000, interval: 500 } });
    try {
      const { nodes } = cluster;
      const master = slotOf(nodes, key).owner;
      const replica = nodes.find((n) => n.cli('INFO', 'replication').includes(`master_port:${master.port}`));
      await until(() => replica.cli('INFO', 'keyspace').includes('db0:keys=1'), 5000);
      await master.stop();
      await until(() => replica.cli('INFO', 'replication').includes('role:master'), 15_000);
      const renewedAfter = seen.length;
      await until(() => seen.slice(renewedAfter).includes('extended') || lock.state !== 'held', 10_000).catch(() => {});
      assert.ok(seen.slice(renewedAfter).includes('extended'), `renewed on the new master; events: ${seen.join(', ')}`);
      assert.equal(lock.state, 'held', `events: ${seen.join(', ')}`);
      assert.equal(await lock.isHeld(), true);
      assert.ok(!seen.includes('lost'), `events: ${seen.join(', ')}`);
      assert.equal(await lock.release(), true);
      assert.equal(replica.cli('INFO', 'keyspace').includes('db0:keys=1'), false);
    } finally {
      if (lock.state === 'held') await lock.release().catch(() => {});
      await adapter.close();
    }
  });
});

describe('RedisAdapter on a Cluster', { skip: ownServer }, () => {
  let cluster;
  before(async () => {
    cluster = await startRedisCluster();
  });
  after(async () => {
    await cluster?.dispose();
  });

  it('locks and fences keys across the slots', async () => {
    const adapter = new RedisAdapter({ urls: cluster.urls, cluster: true });
    const locker = new Locker({ adapter, fencing: true });
    for (const key of ['a', 'b', 'c', 'order:1', '{tagged}:x']) {
      const lock = await locker.acquire(key, { ttl: 2000 });
      assert.ok(lock.fence > 0);
      assert.equal(await lock.isHeld(), true);
      assert.equal(await lock.release(), true);
    }
  });

  // Resharding: the slot of a held, auto-extended lock moves to another master, first half
  // done (the lock's key moved, its fence counter not: a request for the key alone is sent on
  // with ASK, one for both is answered TRYAGAIN until the move ends), then whole (MOVED). Its
  // renewals follow the key, so it is never lost, even while another caller's attempt on the
  // key waits out TRYAGAIN (the Cluster client's own retry waits once stalled the renewals
  // past the lease); and the release deletes the key where it now lives.
  it('a held lock follows its slot to another master while its heartbeat runs', async () => {
    const adapter = new RedisAdapter({ urls: cluster.urls, cluster: true });
    const problems = [];
    const locker = new Locker({
      adapter,
      fencing: true,
      onEvent: (e) => (e.type === 'lost' || e.type === 'extendFailed') && problems.push(e),
    });
    const key = 'moving';
    const lock = await locker.acquire(key, { ttl: 1500, autoExtend: { maxHold: 60_000 } });
    const slot = slotOf(cluster.nodes, key);
    const keysInSlot = slot.keys();
    assert.ok(keysInSlot.includes(key) && keysInSlot.length === 2, `the lock and its fence counter: ${keysInSlot}`);
    const other = new Locker({ adapter, fencing: true });
    try {
      slot.beginMove();
      assert.equal(slot.moveKeys([key]), 'OK');
      // Another caller's try, answered TRYAGAIN for as long as the move stays half done: a
      // backend that cannot answer, never a grant (nor "held", which it cannot know).
      // Its lease (3 s) outlasts the held lock's slack (1 s), which the renewals must not wait for.
      const tried = await other.tryAcquire(key, { ttl: 3000 }).then((v) => v, (e) => e);
      assert.ok(tried instanceof BackendError, `a BackendError, got ${tried}`);
      await sleep(1500); // three intervals more with the move half done
      assert.equal(lock.state, 'held');
      assert.equal(slot.moveKeys(keysInSlot.filter((k) => k !== key)), 'OK');
      slot.endMove();
      await sleep(2000); // and four after it
      assert.equal(lock.state, 'held');
      assert.equal(await lock.isHeld(), true);
      assert.ok(Number(slot.target.cli('PTTL', key)) > 0, 'renewed on the master that owns the slot now');
      assert.deepEqual(problems, []);
      assert.equal(await lock.release(), true);
      assert.equal(slot.target.cli('EXISTS', key), '0');
      // A new fence is read from the counter that moved: later than the lock's.
      const next = await other.acquire(key, { ttl: 1500 });
      assert.ok(next.fence > lock.fence, `${next.fence} after ${lock.fence}`);
      assert.equal(await next.release(), true);
    } finally {
      if (lock.state === 'held') await lock.release().catch(() => {});
      await adapter.close();
    }
  });

  // An acquisition whose key's slot is half moved (its fence counter moved, its lock not yet
  // there) is answered TRYAGAIN, which runs nothing: it is sent again until the move ends,
  // within the caller's budget, rather than failing after the client's first few tries.
  it('an acquisition that meets a slot half moved waits for the move to end', async () => {
    const adapter = new RedisAdapter({ urls: cluster.urls, cluster: true });
    const locker = new Locker({ adapter, fencing: true });
    const key = 'slow-move';
    await (await locker.acquire(key, { ttl: 1500 })).release(); // a fence counter, no lock
    const slot = slotOf(cluster.nodes, key);
    try {
      slot.beginMove();
      const keys = slot.keys();
      assert.deepEqual(keys, [`{${key}}:locco-fence`]);
      assert.equal(slot.moveKeys(keys), 'OK');
      const started = Date.now();
      const acquiring = locker.acquire(key, { ttl: 10_000, retry: { timeout: 8000 } });
      await sleep(3000);
      slot.endMove();
      const lock = await acquiring;
      assert.ok(Date.now() - started >= 3000, 'granted once the move ended');
      assert.equal(slot.target.cli('EXISTS', key), '1');
      assert.equal(await lock.release(), true);
    } finally {
      await adapter.close();
    }
  });

  // A master that forgot the scripts (restarted, or a replica just promoted) is sent a
  // script's body with the lock's own key. Loading it on every master instead would make the
  // renewal wait for the slowest master of the Cluster, here one that does not answer.
  it("a held lock's renewal does not wait for the other masters when its own forgot the scripts", async () => {
    const adapter = new RedisAdapter({ urls: cluster.urls, cluster: true });
    const problems = [];
    const locker = new Locker({ adapter, onEvent: (e) => (e.type === 'lost' || e.type === 'extendFailed') && problems.push(e) });
    const key = 'forgetful';
    const lock = await locker.acquire(key, { ttl: 1500, autoExtend: { maxHold: 60_000 } });
    const { owner, target: stalled } = slotOf(cluster.nodes, key);
    try {
      owner.cli('SCRIPT', 'FLUSH');
      stalled.pause();
      await sleep(2000); // four intervals
      assert.deepEqual(problems, []);
      assert.equal(lock.state, 'held');
      assert.equal(await lock.isHeld(), true);
    } finally {
      stalled.resume();
      if (lock.state === 'held') await lock.release().catch(() => {});
      await adapter.close();
    }
  });

  it('refuses a fenced key with } and no hash tag before sending anything', async () => {
    const adapter = new RedisAdapter({ urls: cluster.urls, cluster: true });
    const err = await new Locker({ adapter, fencing: true }).acquire('a}b', { ttl: 1000 }).catch((e) => e);
    assert.ok(err instanceof ValidationError, String(err));
    assert.equal(err.field, 'key');
  });
});
