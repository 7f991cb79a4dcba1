// The fair queue on MongoDB across processes: request order, pushed hand-offs (a change
// stream of wakes), no barging, and the fault cases. Every holder in a child process runs a
// fenced read-modify-write of a counter (kept on a Redis server), so a second holder (a lost
// update, a fence that goes back) fails the test.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MongoClient } from 'mongodb';
import { Locker } from 'locco-rs';
import { MongoAdapter } from 'locco-rs/mongo';
import { startMongo, startRedis } from '../support/servers.mjs';
import { queueUp, waiters } from '../support/fair.mjs';

const DB = 'fair';
/** Waits until the async `cond()` holds, polling; fails after `ms`. */
async function until(cond, ms = 5000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}
const count = (redis, key) => Number((redis.cli('GET', `count:${key}`) || '0:0').split(':')[1]);

describe('MongoDB fair queue across processes', () => {
  let mongo;
  let redis;
  let client;
  const spawned = [];
  const adapters = [];
  const start = async (n) => {
    const ws = await waiters(n, 'mongo', mongo.url, redis.url, DB);
    spawned.push(...ws);
    return ws;
  };
  const adapter = () => {
    const a = new MongoAdapter({ url: mongo.url, dbName: DB });
    adapters.push(a);
    return a;
  };
  const lockDoc = (key) => client.db(DB).collection('locco-locks').findOne({ key });
  const places = async (key) => (await lockDoc(key))?.queue?.length ?? 0;
  before(async () => {
    [mongo, redis] = await Promise.all([startMongo(), startRedis()]);
    client = new MongoClient(mongo.url);
    await client.connect();
  });
  after(async () => {
    await Promise.all(spawned.map((w) => w.exit()));
    for (const a of adapters) await a.close?.();
    await client.close();
    await Promise.all([mongo.dispose(), redis.dispose()]);
  });
  const noViolations = () => assert.deepEqual(spawned.flatMap((w) => w.violations), []);

  it('grants in request order across processes, each hand-off pushed, not polled', async () => {
    const [holder, ...queue] = await start(4);
    holder.send({ op: 'acquire', key: 'order', ttl: 10_000 });
    await holder.next('granted');
    // Retries 2 s apart: a waiter that is not pushed looks again only at its 1 s re-check.
    for (const w of queue) {
      w.send({ op: 'acquire', key: 'order', ttl: 10_000, timeout: 30_000, delay: 2000 });
      await w.next('queued');
    }
    assert.equal(await places('order'), 3);
    // Let every child's change stream open (they start with the first queued attempt).
    await new Promise((r) => setTimeout(r, 300));
    const order = [];
    let current = holder;
    const pending = new Map(queue.map((w) => [w, w.next('granted').then(() => w)]));
    for (let i = 0; i < queue.length; i++) {
      const released = performance.now();
      current.send({ op: 'release' });
      const next = await Promise.race(pending.values());
      pending.delete(next);
      order.push(queue.indexOf(next));
      // A hand-off well under the 1 s re-check came from the push.
      const took = performance.now() - released;
      if (process.env.FAIR_DEBUG) console.error(`hand-off ${i}: ${took.toFixed(1)} ms`);
      assert.ok(took < 150, `hand-off took ${took} ms`);
      current = next;
    }
    current.send({ op: 'release' });
    await current.next('released');
    assert.deepEqual(order, [0, 1, 2]);
    assert.equal(count(redis, 'order'), 4);
    // The last release, with nobody waiting, deletes the document.
    assert.equal(await lockDoc('order'), null);
    noViolations();
  });

  it('a try, or a process that just released, does not take a key promised to a waiter', async () => {
    const [holder, waiter] = await start(2);
    holder.send({ op: 'acquire', key: 'barge', ttl: 10_000 });
    await holder.next('granted');
    await queueUp(waiter, 'barge');
    const locker = new Locker({ adapter: adapter(), fencing: true });
    const plain = new Locker({ adapter: adapter() });
    // While held: a try is refused, and so it is once the key is free but promised.
    assert.equal(await plain.tryAcquire('barge', { ttl: 1000 }), null);
    holder.send({ op: 'release' });
    await holder.next('released');
    // The releaser asks again at once: it goes behind the waiter.
    holder.send({ op: 'acquire', key: 'barge', ttl: 10_000 });
    assert.equal(await locker.tryAcquire('barge', { ttl: 1000 }), null, 'a fenced try barged');
    assert.equal(await plain.tryAcquire('barge', { ttl: 1000 }), null, 'a try barged');
    await waiter.next('granted');
    assert.equal(holder.has('granted'), false);
    waiter.send({ op: 'release' });
    await holder.next('granted');
    holder.send({ op: 'release' });
    await holder.next('released');
    assert.equal(count(redis, 'barge'), 3);
    // Nobody waits any more: a try takes the key again.
    const lock = await plain.tryAcquire('barge', { ttl: 1000 });
    assert.notEqual(lock, null);
    await lock.release();
    noViolations();
  });

  it('a key freed while waiters wait stays reserved for the head, not deleted', async () => {
    const locker = new Locker({ adapter: adapter() });
    const held = await locker.acquire('reserved', { ttl: 10_000 });
    const [waiter] = await start(1);
    await queueUp(waiter, 'reserved');
    // A waiter that queued behind a holder leaves the lease alone.
    assert.equal((await lockDoc('reserved')).uniqueValue, held.token);
    waiter.child.kill('SIGSTOP'); // cannot take its turn yet
    try {
      await held.release();
      const doc = await lockDoc('reserved');
      assert.notEqual(doc, null, 'the document of a key with waiters outlives its release');
      assert.equal(doc.uniqueValue, undefined);
      assert.equal(doc.queue.length, 1);
      assert.equal(await locker.tryAcquire('reserved', { ttl: 1000 }), null);
    } finally {
      waiter.child.kill('SIGCONT');
    }
    await waiter.next('granted');
    waiter.send({ op: 'release' });
    await waiter.next('released');
    assert.equal(await lockDoc('reserved'), null);
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
    assert.ok(waited < 3000 + 1000 + 3000, `waited ${waited} ms`);
    next.send({ op: 'release' });
    await next.next('released');
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
    await head.next('released');
    noViolations();
  });

  it('an aborted or timed-out waiter leaves the queue at once', async () => {
    const locker = new Locker({ adapter: adapter() });
    const held = await locker.acquire('leave', { ttl: 10_000 });
    const ac = new AbortController();
    const aborted = locker.acquire('leave', { ttl: 1000, signal: ac.signal }).catch((e) => e);
    const timedOut = locker.acquire('leave', { ttl: 1000, retry: { timeout: 300 } }).catch((e) => e);
    await until(async () => (await places('leave')) === 2, 3000);
    ac.abort();
    await aborted;
    await timedOut;
    await until(async () => (await places('leave')) === 0, 1000);
    // Nobody waits: the release deletes the document.
    await held.release();
    assert.equal(await lockDoc('leave'), null);
  });

  it('a head that leaves a free key passes the wake on at once', async () => {
    const locker = new Locker({ adapter: adapter() });
    const held = await locker.acquire('pass-on', { ttl: 10_000 });
    const [first, second] = await start(2);
    await queueUp(first, 'pass-on');
    await queueUp(second, 'pass-on');
    await new Promise((r) => setTimeout(r, 300));
    first.child.kill('SIGSTOP');
    try {
      await held.release(); // reserved for `first`, which is stopped
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(second.has('granted'), false);
    } finally {
      first.child.kill('SIGKILL'); // never leaves: its place runs out
    }
    const t = performance.now();
    await second.next('granted', 10_000);
    assert.ok(performance.now() - t < 3000 + 1000 + 2000, `waited ${performance.now() - t} ms`);
    second.send({ op: 'release' });
    await second.next('released');
    noViolations();
  });

  it('60 waiters on one key in one process: all granted, in order, none overlapping', async () => {
    const locker = new Locker({ adapter: adapter(), fencing: true });
    const first = await locker.acquire('sixty', { ttl: 10_000 });
    const order = [];
    let inside = 0;
    let last = first.fence;
    const all = [];
    const n = 60;
    for (let i = 0; i < n; i++) {
      all.push(
        locker.acquire('sixty', { ttl: 10_000, retry: { retries: Infinity, timeout: 60_000 } }).then(async (lock) => {
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
      await until(async () => (await places('sixty')) === i + 1, 3000);
    }
    const released = performance.now();
    await first.release();
    await Promise.all(all);
    // Pushed hand-offs: far faster than one re-check per waiter.
    const took = performance.now() - released;
    assert.ok(took < n * 100, `${n} hand-offs took ${took} ms`);
    assert.deepEqual(order, [...Array(n).keys()]);
    assert.equal(await lockDoc('sixty'), null);
  });
});
