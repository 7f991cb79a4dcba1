// The fair queue on Redis across processes: request order, no barging, and each fault case
// the issue names. Every holder runs a fenced read-modify-write of a counter, so a second
// holder (a lost update, a fence that goes back) fails the test.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Locker } from 'locco-rs';
import { RedisAdapter } from 'locco-rs/redis';
import { startRedis, startRedisCluster } from '../support/servers.mjs';
import { until } from '../support/adapters.mjs';
import { queueUp, waiters } from '../support/fair.mjs';

const count = (redis, key) => Number((redis.cli('GET', `count:${key}`) || '0:0').split(':')[1]);

describe('Redis fair queue across processes', () => {
  let redis;
  const spawned = [];
  const start = async (n, url = redis.url) => {
    const ws = await waiters(n, 'redis', url, redis.url);
    spawned.push(...ws);
    return ws;
  };
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    await Promise.all(spawned.map((w) => w.exit()));
    await redis.dispose();
  });
  const noViolations = () => assert.deepEqual(spawned.flatMap((w) => w.violations), []);

  it('grants in request order across processes, each hand-off pushed, not polled', async () => {
    const [holder, ...queue] = await start(4);
    holder.send({ op: 'acquire', key: 'order', ttl: 10_000 });
    await holder.next('granted');
    for (const w of queue) await queueUp(w, 'order');
    const order = [];
    let current = holder;
    const pending = new Map(queue.map((w) => [w, w.next('granted').then(() => w)]));
    for (let i = 0; i < queue.length; i++) {
      const released = performance.now();
      current.send({ op: 'release' });
      const next = await Promise.race(pending.values());
      pending.delete(next);
      order.push(queue.indexOf(next));
      // The default retry delay is 200 ms: a hand-off well under it came from the push.
      assert.ok(performance.now() - released < 150, `hand-off took ${performance.now() - released} ms`);
      current = next;
    }
    current.send({ op: 'release' });
    assert.deepEqual(order, [0, 1, 2]);
    assert.equal(count(redis, 'order'), 4);
    noViolations();
  });

  it('a try, or a process that just released, does not take a key promised to a waiter', async () => {
    const [holder, waiter] = await start(2);
    holder.send({ op: 'acquire', key: 'barge', ttl: 10_000 });
    await holder.next('granted');
    await queueUp(waiter, 'barge');
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }) });
    holder.send({ op: 'release' });
    await holder.next('released');
    // The releaser asks again at once: it goes behind the waiter.
    holder.send({ op: 'acquire', key: 'barge', ttl: 10_000 });
    assert.equal(await locker.tryAcquire('barge', { ttl: 1000 }), null);
    await waiter.next('granted');
    assert.equal(holder.has('granted'), false);
    waiter.send({ op: 'release' });
    await holder.next('granted');
    holder.send({ op: 'release' });
    await holder.next('released');
    assert.equal(count(redis, 'barge'), 3);
    noViolations();
  });

  it('a waiter SIGKILLed in the queue holds up the next one for about its place lease only', async () => {
    const [holder, doomed, next] = await start(3);
    holder.send({ op: 'acquire', key: 'killed-waiter', ttl: 10_000 });
    await holder.next('granted');
    await queueUp(doomed, 'killed-waiter');
    await queueUp(next, 'killed-waiter');
    doomed.child.kill('SIGKILL');
    const released = performance.now();
    holder.send({ op: 'release' });
    await next.next('granted', 15_000);
    const waited = performance.now() - released;
    // The place lease is 3 s and a waiter re-checks at least every second.
    assert.ok(waited < 8000, `waited ${waited} ms`);
    next.send({ op: 'release' });
    noViolations();
  });

  it('a holder SIGKILLed: the head takes the key when its lease ends', async () => {
    const [holder, head] = await start(2);
    holder.send({ op: 'acquire', key: 'killed-holder', ttl: 1500 });
    await holder.next('granted');
    await queueUp(head, 'killed-holder');
    const killed = performance.now();
    holder.child.kill('SIGKILL');
    await head.next('granted', 15_000);
    const waited = performance.now() - killed;
    assert.ok(waited < 1500 + 1500, `waited ${waited} ms`);
    head.send({ op: 'release' });
    noViolations();
  });

  it('a cut push connection: the waiters still get the key, and pushes work again after', async () => {
    const [holder, a, b] = await start(3);
    holder.send({ op: 'acquire', key: 'cut', ttl: 10_000 });
    await holder.next('granted');
    await queueUp(a, 'cut');
    await queueUp(b, 'cut');
    const channels = () => redis.cli('PUBSUB', 'CHANNELS', 'locco:wake:*').split('\n').filter(Boolean).length;
    const subscribed = channels();
    assert.ok(subscribed >= 2, `${subscribed} push channels`);
    redis.cli('CLIENT', 'KILL', 'TYPE', 'pubsub');
    holder.send({ op: 'release' });
    await a.next('granted', 10_000);
    // Once the subscriptions are back, the next hand-off is a push again.
    await until(() => channels() >= subscribed, 10_000);
    const released = performance.now();
    a.send({ op: 'release' });
    await b.next('granted', 10_000);
    assert.ok(performance.now() - released < 150, `hand-off after the cut took ${performance.now() - released} ms`);
    b.send({ op: 'release' });
    noViolations();
  });

  it('a server restarted while waiters wait: every waiter still gets the key, one at a time', async () => {
    const [holder, a, b] = await start(3);
    holder.send({ op: 'acquire', key: 'restart', ttl: 10_000 });
    await holder.next('granted');
    await queueUp(a, 'restart');
    await queueUp(b, 'restart');
    await redis.restart(); // no persistence: the lock and its queue are gone
    // The queue is gone with the data, so either may come first; never both at once.
    const granted = new Map([a, b].map((w) => [w, w.next('granted', 20_000).then(() => w)]));
    const first = await Promise.race(granted.values());
    const second = first === a ? b : a;
    let secondIn = false;
    granted.get(second).then(() => (secondIn = true));
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(secondIn, false, 'one holder at a time');
    first.send({ op: 'release' });
    await granted.get(second);
    second.send({ op: 'release' });
    await second.next('released');
    assert.equal(count(redis, 'restart'), 2);
    noViolations();
  });

  it('an aborted or timed-out waiter leaves the queue at once', async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }) });
    const held = await locker.acquire('leave', { ttl: 10_000 });
    const ac = new AbortController();
    const aborted = locker.acquire('leave', { ttl: 1000, signal: ac.signal }).catch((e) => e);
    const timedOut = locker.acquire('leave', { ttl: 1000, retry: { timeout: 300 } }).catch((e) => e);
    await until(() => redis.cli('LLEN', 'leave:locco-q') === '2', 3000);
    ac.abort();
    await aborted;
    await timedOut;
    await until(() => redis.cli('LLEN', 'leave:locco-q') === '0', 3000);
    await held.release();
  });

  it('a holder with waiters still extends, observes and releases its lock', async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }) });
    const held = await locker.acquire('marked', { ttl: 10_000 });
    const waiting = locker.acquire('marked', { ttl: 1000, retry: { retries: Infinity, timeout: 20_000, delay: 1000 } });
    // The holder's value says someone waits, so that its release hands the key over.
    await until(() => redis.cli('GET', 'marked') === `${held.token}|locco:waited`, 3000);
    await held.extend(20_000);
    assert.ok(Number(redis.cli('PTTL', 'marked')) > 10_000);
    assert.equal(await held.isHeld(), true);
    const released = performance.now();
    assert.equal(await held.release(), true);
    const next = await waiting;
    assert.ok(performance.now() - released < 300, 'handed over by the release, not found by a re-check');
    assert.equal(redis.cli('GET', 'marked'), next.token);
    await next.release();
    assert.equal(redis.cli('EXISTS', 'marked'), '0');
    await locker.close();
  });

  it('a head that gives up a key reserved for it hands it to the next waiter at once', async () => {
    // The head's user may publish but not subscribe, so it hears no push: the released key
    // stays reserved for it until it re-checks (a second later) or leaves.
    redis.cli('ACL', 'SETUSER', 'deaf', 'on', '>deaf-pw', '~*', 'allchannels', '+@all', '-@pubsub', '+publish');
    const deafUrl = redis.url.replace('redis://', 'redis://deaf:deaf-pw@');
    const checks = { head: () => {}, next: () => {} };
    const checked = (who) => new Promise((r) => (checks[who] = r));
    const waiter = (url, who) =>
      new Locker({ adapter: new RedisAdapter({ url }), onEvent: (e) => e.type === 'contended' && checks[who]() });
    const [holder, deaf, other] = [new Locker({ adapter: new RedisAdapter({ url: redis.url }) }), waiter(deafUrl, 'head'), waiter(redis.url, 'next')];
    const held = await holder.acquire('handover', { ttl: 10_000 });
    const wait = { retries: Infinity, timeout: 20_000, delay: 1000 };
    const ac = new AbortController();
    let headChecked = checked('head');
    const head = deaf.acquire('handover', { ttl: 1000, retry: wait, signal: ac.signal }).catch((e) => e);
    await headChecked;
    let nextChecked = checked('next');
    const next = other.acquire('handover', { ttl: 1000, retry: wait });
    await nextChecked;
    // Right after both re-checked, so the next re-check of each is about a second away.
    [headChecked, nextChecked] = [checked('head'), checked('next')];
    await Promise.all([headChecked, nextChecked]);
    await held.release();
    assert.match(redis.cli('GET', 'handover'), /^locco:reserved\|/);
    const left = performance.now();
    ac.abort();
    assert.equal((await head).name, 'AbortError');
    const lock = await next;
    const waited = performance.now() - left;
    assert.ok(waited < 300, `the next waiter got the key ${waited} ms after the head left`);
    await lock.release();
    assert.equal(redis.cli('EXISTS', 'handover'), '0');
    await Promise.all([holder, deaf, other].map((l) => l.close()));
  });

  it('100 waiters on one key in one process: all granted, in order, none overlapping', async () => {
    const locker = new Locker({ adapter: new RedisAdapter({ url: redis.url }), fencing: true });
    const first = await locker.acquire('hundred', { ttl: 10_000 });
    const order = [];
    let inside = 0;
    let last = first.fence;
    const all = [];
    for (let i = 0; i < 100; i++) {
      all.push(
        locker.acquire('hundred', { ttl: 10_000, retry: { retries: Infinity, timeout: 60_000 } }).then(async (lock) => {
          assert.equal(inside++, 0, 'one holder at a time');
          assert.ok(lock.fence > last);
          last = lock.fence;
          order.push(i);
          await new Promise((r) => setImmediate(r));
          inside--;
          await lock.release();
        }),
      );
      // Each asks after the previous one is queued, so request order is well defined.
      await until(() => Number(redis.cli('LLEN', 'hundred:locco-q')) === i + 1, 3000);
    }
    await first.release();
    await Promise.all(all);
    assert.deepEqual(order, [...Array(100).keys()]);
  });
});

describe('Redis fair queue on a Cluster', () => {
  let cluster;
  const spawned = [];
  before(async () => {
    cluster = await startRedisCluster();
  });
  after(async () => {
    await Promise.all(spawned.map((w) => w.exit()));
    await cluster?.dispose();
  });

  it('hands keys over in request order on every slot, pushed across nodes', async () => {
    const counter = await startRedis();
    try {
      const urls = cluster.urls.join(',');
      const ws = await waiters(3, 'redis-cluster', urls, counter.url);
      spawned.push(...ws);
      for (const key of ['a', 'b', 'order:7', '{tagged}:x']) {
        const [holder, x, y] = ws;
        holder.send({ op: 'acquire', key, ttl: 10_000 });
        await holder.next('granted');
        await queueUp(x, key);
        await queueUp(y, key);
        let released = performance.now();
        holder.send({ op: 'release' });
        await x.next('granted');
        assert.ok(performance.now() - released < 150, `${key}: hand-off took ${performance.now() - released} ms`);
        assert.equal(y.has('granted'), false);
        released = performance.now();
        x.send({ op: 'release' });
        await y.next('granted');
        y.send({ op: 'release' });
        await y.next('released');
        await holder.next('released');
        await x.next('released');
        assert.equal(count(counter, key), 3);
      }
      assert.deepEqual(ws.flatMap((w) => w.violations), []);
    } finally {
      await counter.dispose();
    }
  });
});
