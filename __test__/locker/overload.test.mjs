// Overload on one Redis connection: more requests than the server can drain. Held locks must
// keep their leases (their renewals go ahead of the flood), and no request may fail for want
// of an answer while the server is answering, only slowly.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Locker } from 'locco-rs';
import { RedisAdapter } from 'locco-rs/redis';
import { startRedis } from '../support/servers.mjs';

/** Flood requests; a debug build sends them faster than the throttled server answers. */
const FLOOD = 40_000;
/** Requests started per turn of the event loop (a busy service, not one synchronous loop). */
const PER_TURN = 1000;
const HELD_TTL = 4000;

describe('RedisAdapter under overload', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis.dispose());

  for (const commandTimeout of [undefined, 1000]) {
    it(`held locks keep their leases through a flood of acquires (commandTimeout ${commandTimeout ?? 'default'})`, async () => {
      const adapter = new RedisAdapter({ url: redis.url, commandTimeout });
      const lost = [];
      const locker = new Locker({ adapter, retry: { retries: 0 }, onEvent: (e) => e.type === 'lost' && e.key.includes(':held:') && lost.push(e) });
      const prefix = `flood:${commandTimeout}:`;
      const held = await Promise.all(
        Array.from({ length: 4 }, (_, i) => locker.acquire(`${prefix}held:${i}`, { ttl: HELD_TTL, autoExtend: { maxHold: 600_000 } })),
      );
      // The server runs 1 ms in 150 (each pause shorter than commandTimeout): a few thousand
      // requests a second. Before the engine bounded its requests in flight, the flood's
      // backlog stood in the server's input ahead of every renewal, and each held lock ran
      // out its lease ('late-extend').
      const unthrottle = redis.throttle(1, 149);
      let results;
      const started = performance.now();
      try {
        const tries = [];
        for (let i = 0; i < FLOOD; i++) {
          // Settled at once: a failure must not go unhandled while the flood is still sent.
          tries.push(locker.tryAcquire(`${prefix}${i}`, { ttl: 60_000 }).then((value) => ({ value }), (reason) => ({ reason })));
          if (i % PER_TURN === PER_TURN - 1) await new Promise((r) => setImmediate(r));
        }
        results = await Promise.all(tries);
      } finally {
        await unthrottle();
      }
      const took = performance.now() - started;
      const failed = results.filter((r) => r.reason).map((r) => r.reason.message);
      assert.deepEqual(failed.slice(0, 3), [], `${failed.length} of ${FLOOD} requests failed`);
      assert.ok(results.every((r) => r.value !== null), 'every flooded key was free and granted');
      // The flood outlasted the held locks' lease: their renewals were answered in between.
      assert.ok(took > HELD_TTL, `the flood took ${Math.round(took)} ms, less than a lease`);
      assert.deepEqual(
        held.map((l) => l.state),
        held.map(() => 'held'),
        `lost: ${lost.map((e) => e.lostReason ?? e.reason).join(', ')}`,
      );
      assert.deepEqual(await Promise.all(held.map((l) => l.isHeld())), [true, true, true, true]);
      await Promise.all([...held, ...results.map((r) => r.value)].map((l) => l.release()));
    });
  }
});
