'use strict';
// The adapter contract, as tests any runner can register: pass { describe, it, beforeEach,
// afterEach } (node:test and vitest both have them).

const { randomBytes } = require('node:crypto');

const MAX_SAFE = 2 ** 53;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function check(ok, message) {
  if (!ok) throw new Error(`contract: ${message}`);
}

function registerContract(name, factory, { describe, it, beforeEach, afterEach }) {
  describe(`lock adapter contract: ${name}`, () => {
    let adapter;
    let cleanup;
    let key;
    const token = () => randomBytes(8).toString('hex');

    beforeEach(async () => {
      const made = await factory();
      adapter = made.adapter;
      cleanup = made.cleanup;
      key = `contract:${randomBytes(6).toString('hex')}`;
    });
    afterEach(async () => {
      if (cleanup) await cleanup();
    });

    it('acquire takes a free key and refuses a held one', async () => {
      const [a, b] = [token(), token()];
      check((await adapter.acquire({ key, token: a, ttl: 10_000 })) === true, 'acquire of a free key answers true');
      check((await adapter.acquire({ key, token: b, ttl: 10_000 })) === false, 'acquire of a held key answers false');
      check((await adapter.acquire({ key, token: a, ttl: 10_000 })) === false, 'acquire is not re-entrant');
    });

    it('release deletes only our key', async () => {
      const [a, b] = [token(), token()];
      await adapter.acquire({ key, token: a, ttl: 10_000 });
      check((await adapter.release({ key, token: b })) === false, 'release with a wrong token answers false');
      check((await adapter.isHeld({ key, token: a })) === true, 'a wrong-token release leaves the key');
      check((await adapter.release({ key, token: a })) === true, 'release of our key answers true');
      check((await adapter.release({ key, token: a })) === false, 'a second release answers false');
      check((await adapter.release({ key: `${key}:none`, token: a })) === false, 'release of a missing key answers false');
      check((await adapter.acquire({ key, token: b, ttl: 10_000 })) === true, 'a released key can be taken');
    });

    it('extend renews only our live key', async () => {
      const [a, b] = [token(), token()];
      await adapter.acquire({ key, token: a, ttl: 10_000 });
      check((await adapter.extend({ key, token: b, ttl: 10_000 })) === false, 'extend with a wrong token answers false');
      check((await adapter.extend({ key, token: a, ttl: 10_000 })) === true, 'extend of our key answers true');
      check((await adapter.extend({ key: `${key}:none`, token: a, ttl: 1000 })) === false, 'extend of a missing key answers false');
      check((await adapter.isHeld({ key: `${key}:none`, token: a })) === false, 'extend never creates a key');
    });

    it('isHeld tells our key from others', async () => {
      const [a, b] = [token(), token()];
      check((await adapter.isHeld({ key, token: a })) === false, 'isHeld of a free key answers false');
      await adapter.acquire({ key, token: a, ttl: 10_000 });
      check((await adapter.isHeld({ key, token: a })) === true, 'isHeld of our key answers true');
      check((await adapter.isHeld({ key, token: b })) === false, "isHeld of another holder's key answers false");
    });

    it('an expired key is free, not held, and cannot be extended back', async () => {
      const [a, b] = [token(), token()];
      await adapter.acquire({ key, token: a, ttl: 100 });
      await sleep(400);
      check((await adapter.isHeld({ key, token: a })) === false, 'isHeld answers false after the TTL');
      check((await adapter.extend({ key, token: a, ttl: 10_000 })) === false, 'extend of an expired key answers false');
      check((await adapter.isHeld({ key, token: a })) === false, 'extend does not re-create an expired key');
      check((await adapter.acquire({ key, token: b, ttl: 10_000 })) === true, 'acquire of an expired key answers true');
    });

    it('honours the TTL within a tolerance', async () => {
      const a = token();
      await adapter.acquire({ key, token: a, ttl: 1000 });
      await sleep(300);
      check((await adapter.isHeld({ key, token: a })) === true, 'the key lives until its TTL');
      check((await adapter.extend({ key, token: a, ttl: 300 })) === true, 'extend answers true');
      await sleep(800);
      check((await adapter.isHeld({ key, token: a })) === false, 'extend sets the TTL from now, not added to the old one');
    });

    it('grants a key to exactly one of many parallel callers', async () => {
      const answers = await Promise.all(
        Array.from({ length: 32 }, () => adapter.acquire({ key, token: token(), ttl: 10_000 })),
      );
      check(answers.filter((x) => x === true).length === 1, `exactly one grant, got ${answers.filter(Boolean).length}`);
      check(answers.every((x) => typeof x === 'boolean'), 'every answer is a boolean');
    });

    const fenced = (title, fn) =>
      it(title, async (ctx) => {
        if (typeof adapter.acquireFenced !== 'function') {
          // Skipped at run time for an adapter without fencing (the factory is async).
          if (ctx && typeof ctx.skip === 'function') ctx.skip('no acquireFenced');
          return;
        }
        await fn();
      });

    fenced('acquireFenced tokens strictly increase per key and survive a release', async () => {
      let last = 0;
      for (let i = 0; i < 5; i++) {
        const t = token();
        const fence = await adapter.acquireFenced({ key, token: t, ttl: 10_000 });
        check(Number.isInteger(fence) && fence > 0, `a fence is a positive integer, got ${fence}`);
        check(fence < MAX_SAFE, 'a fence stays below 2^53');
        check(fence > last, `fences strictly increase (${fence} after ${last})`);
        last = fence;
        check((await adapter.release({ key, token: t })) === true, 'a fenced grant releases like any other');
      }
    });

    fenced('acquireFenced answers null when the key is held', async () => {
      const [a, b] = [token(), token()];
      check(typeof (await adapter.acquireFenced({ key, token: a, ttl: 10_000 })) === 'number', 'first grant');
      check((await adapter.acquireFenced({ key, token: b, ttl: 10_000 })) === null, 'null while held');
      check((await adapter.acquire({ key, token: b, ttl: 10_000 })) === false, 'a fenced grant holds the key');
    });

    const queued = (title, fn) =>
      it(title, async (ctx) => {
        if (typeof adapter.acquireQueued !== 'function') {
          if (ctx && typeof ctx.skip === 'function') ctx.skip('no queue methods');
          return;
        }
        await fn();
      });
    const ask = (waiter, t = token(), extra = {}) =>
      adapter.acquireQueued({ key, token: t, ttl: 10_000, waiter, lease: 3000, fenced: false, ...extra });

    queued('acquireQueued grants a free key with nobody waiting, and queues behind a holder', async () => {
      const first = await ask('w1');
      check(first && first.granted === true, 'a free key is granted');
      const second = await ask('w2');
      check(second && second.granted === false, 'a held key is not');
      check(second.retryIn === undefined || (second.retryIn >= 0 && second.retryIn <= 10_000), `retryIn at the head is the holder's lease left, got ${second.retryIn}`);
    });

    queued('a free key goes to the head of its queue only, and a plain acquire waits its turn', async () => {
      const holder = token();
      await ask('h', holder);
      check((await ask('w1')).granted === false, 'w1 queued');
      check((await ask('w2')).granted === false, 'w2 queued');
      check((await adapter.release({ key, token: holder })) === true, 'released');
      check((await adapter.acquire({ key, token: token(), ttl: 10_000 })) === false, 'a plain acquire does not take a key promised to a waiter');
      check((await ask('w2')).granted === false, 'w2 is not the head');
      const w1 = token();
      check((await ask('w1', w1)).granted === true, 'the head takes it');
      check((await adapter.isHeld({ key, token: w1 })) === true, 'and holds it');
      await adapter.release({ key, token: w1 });
      check((await ask('w2')).granted === true, 'then the next');
    });

    queued('leaveQueue passes the turn on, and a place ends with its lease', async () => {
      const holder = token();
      await ask('h', holder);
      await ask('gone');
      await ask('short', token(), { lease: 200 });
      await ask('next');
      await adapter.leaveQueue({ key, waiter: 'gone' });
      await adapter.release({ key, token: holder });
      await sleep(400);
      check((await ask('next')).granted === true, 'a waiter that left, and a place whose lease ran out, hold nobody up');
    });

    queued('watchQueue is told the head of a released key', async () => {
      const holder = token();
      await ask('h', holder);
      await ask('head');
      await ask('second');
      const woken = [];
      const seen = new Promise((resolve) => {
        adapter.watchQueue((w) => {
          woken.push(w);
          resolve();
        });
      });
      await adapter.release({ key, token: holder });
      await Promise.race([seen, sleep(2000)]);
      check(woken[0] === 'head', `the head was woken, got ${JSON.stringify(woken)}`);
    });

    queued('acquireQueued with fenced takes a fencing token that grows', async () => {
      if (typeof adapter.acquireFenced !== 'function') return;
      const a = token();
      const one = await ask('f1', a, { fenced: true });
      check(one.granted === true && Number.isSafeInteger(one.fence) && one.fence > 0, `a fence, got ${JSON.stringify(one)}`);
      await adapter.release({ key, token: a });
      const two = await ask('f2', token(), { fenced: true });
      check(two.fence > one.fence, 'fences grow');
    });
  });
}

module.exports = { registerContract };
