// Requests made in one process are served in the order they were made, whichever of the
// process's managers (and connections) they go out over.
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { createRequire } from 'node:module';
import { after, before, describe, it } from 'node:test';
import { MutexManager, MutexTimeoutError } from 'locco-rs/mutex';
import { RedisAdapter } from 'locco-rs/redis';
import { startRedis } from '../support/servers.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const { delays } = createRequire(import.meta.url)('../../lib/native.js');

/**
 * `total` calls made in one synchronous loop, call i on manager i % managers.length and id
 * i % ids.length, each callback 5-35 ms long. Answers each id's callbacks in the order they ran
 * (by call number per id) and the largest number of callbacks seen running at once on one id.
 */
async function burst(managers, ids, total) {
  const ran = new Map(ids.map((id) => [id, []]));
  const inside = new Map(ids.map((id) => [id, 0]));
  let overlap = 0;
  const calls = [];
  for (let i = 0; i < total; i++) {
    const id = ids[i % ids.length];
    const nth = Math.floor(i / ids.length);
    calls.push(
      managers[i % managers.length].runOperation(id, async () => {
        inside.set(id, inside.get(id) + 1);
        overlap = Math.max(overlap, inside.get(id));
        await sleep(randomInt(5, 36));
        ran.get(id).push(nth);
        inside.set(id, inside.get(id) - 1);
      }),
    );
  }
  await Promise.all(calls);
  return { ran, overlap };
}

describe('MutexManager: request order within one process', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis.dispose());

  it('4 managers on one Redis, 3 ids, 90 calls in one loop: each id runs in call order, 20 times over', async () => {
    const managers = Array.from({ length: 4 }, () => new MutexManager({ redis: { url: redis.url } }));
    try {
      for (let round = 0; round < 20; round++) {
        const ids = ['alpha', 'beta', 'gamma'].map((id) => `${id}-${round}`);
        const { ran, overlap } = await burst(managers, ids, 90);
        assert.equal(overlap, 1, `round ${round}: no two callbacks of one id at once`);
        for (const id of ids) {
          assert.deepEqual(ran.get(id), [...Array(30).keys()], `round ${round}, ${id}: ${ran.get(id).join(', ')}`);
        }
      }
    } finally {
      await Promise.all(managers.map((m) => m.dispose()));
    }
  });

  it('managers given one adapter share the order too', async () => {
    const adapter = new RedisAdapter({ url: redis.url });
    const managers = Array.from({ length: 3 }, () => new MutexManager({ adapter, namespace: 'one-adapter' }));
    try {
      const { ran, overlap } = await burst(managers, ['x', 'y'], 40);
      assert.equal(overlap, 1);
      for (const id of ['x', 'y']) assert.deepEqual(ran.get(id), [...Array(20).keys()]);
    } finally {
      await adapter.close();
    }
  });

  it('a request that gives up before its turn leaves the line; the ones behind it keep their order', async () => {
    const managers = Array.from({ length: 3 }, () => new MutexManager({ redis: { url: redis.url }, namespace: 'leave' }));
    try {
      const order = [];
      const calls = [];
      // A holder, then requests on alternating managers; the third gives up after 30 ms and a
      // signal ends the fifth at once.
      calls.push(managers[0].runOperation('k', () => sleep(150).then(() => order.push(0))));
      const controller = new AbortController();
      for (let i = 1; i < 8; i++) {
        const options = i === 3 ? { timeoutMs: 30 } : i === 5 ? { signal: controller.signal } : {};
        calls.push(managers[i % 3].runOperation('k', () => order.push(i), options).catch((e) => e.name));
      }
      controller.abort();
      const outcomes = await Promise.all(calls);
      assert.equal(outcomes[3], MutexTimeoutError.name);
      assert.equal(outcomes[5], 'MutexAbortedError');
      assert.deepEqual(order, [0, 1, 2, 4, 6, 7]);
      // Nothing of this process is left waiting: the next request is served at once.
      assert.equal(await managers[1].runOperation('k', () => 'free', { timeoutMs: 1000 }), 'free');
    } finally {
      await Promise.all(managers.map((m) => m.dispose()));
    }
  });

  it('keeps nothing per request once the requests are served', async () => {
    const managers = Array.from({ length: 2 }, () => new MutexManager({ redis: { url: redis.url }, namespace: 'kept' }));
    try {
      const before = delays.size;
      const calls = Array.from({ length: 100 }, (_, i) => managers[i % 2].runOperation('k', () => sleep(1)));
      await Promise.all(calls);
      assert.equal(delays.size, before, 'the delay functions of the queued acquisitions are gone');
    } finally {
      await Promise.all(managers.map((m) => m.dispose()));
    }
  });
});
