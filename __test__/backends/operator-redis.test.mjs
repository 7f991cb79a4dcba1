// The operator calls (locker.inspect, list, forceRelease, and `locco-rs inspect/release`) on
// Redis, standalone and Cluster, against keys the application wrote: only a value this library
// wrote as a lock is ever shown as held or removed; everything else is left as it was.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, describe, it } from 'node:test';
import { Locker } from 'locco-rs';
import { RedisAdapter } from 'locco-rs/redis';
import { runCli } from '../support/run-node.mjs';
import { startRedis, startRedisCluster } from '../support/servers.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let n = 0;
const unique = (name) => `operator:${name}:${process.pid}:${++n}`;


const cli = (args) => runCli(args);

/**
 * Keys an application wrote, each with a way to write it and to read it back whole (type,
 * content and expiry), so a test can tell that nothing touched it.
 */
const foreign = [
  ['a string without expiry', (k) => [['SET', k, 'precious']]],
  ['a hash', (k) => [['HSET', k, 'name', 'Ada']]],
  ['a list', (k) => [['RPUSH', k, 'a', 'b']]],
  ['a set', (k) => [['SADD', k, 'x']]],
  ['a hash with an expiry', (k) => [['HSET', k, 'name', 'Ada'], ['PEXPIRE', k, '60000']]],
];
const snapshot = (redis, k) => {
  const type = redis(['TYPE', k]);
  const content = { string: ['GET', k], hash: ['HGETALL', k], list: ['LRANGE', k, '0', '-1'], set: ['SMEMBERS', k] }[type];
  return { type, content: content ? redis(content) : undefined, expires: Number(redis(['PTTL', k])) > 0 };
};

for (const setup of [
  {
    name: 'Redis',
    async start() {
      const server = await startRedis();
      return { url: server.url, adapter: () => new RedisAdapter({ url: server.url }), redis: (cmd) => server.cli(...cmd), dispose: () => server.dispose() };
    },
  },
  {
    name: 'Redis Cluster',
    async start() {
      const cluster = await startRedisCluster();
      const port = String(cluster.nodes[0].port);
      return {
        adapter: () => new RedisAdapter({ urls: cluster.urls, cluster: true }),
        redis: (cmd) => execFileSync('redis-cli', ['-c', '-p', port, ...cmd], { encoding: 'utf8' }).trim(),
        dispose: () => cluster.dispose(),
      };
    },
  },
]) {
  describe(`${setup.name}: operator calls on keys that are not locks`, () => {
    let env;
    let adapter;
    let locker;
    before(async () => {
      env = await setup.start();
      adapter = env.adapter();
      locker = new Locker({ adapter, fencing: true });
    });
    after(async () => {
      await locker.close();
      await adapter.close();
      await env.dispose();
    });

    for (const [what, write] of foreign) {
      it(`${what}: inspect says not held, list skips it, forceRelease answers false and leaves it`, async () => {
        const key = unique('app');
        for (const cmd of write(key)) env.redis(cmd);
        const before = snapshot(env.redis, key);
        assert.deepEqual(await locker.inspect(key), { held: false });
        assert.deepEqual(await locker.list({ prefix: key }), []);
        assert.equal(await locker.forceRelease(key), false);
        assert.deepEqual(snapshot(env.redis, key), before, 'the application key was changed');
      });
    }

    it("a lock's fencing counter is no lock: not shown, not listed, not removed", async () => {
      const key = unique('fenced');
      const lock = await locker.acquire(key, { ttl: 10_000 });
      const counter = `{${key}}:locco-fence`;
      assert.equal(env.redis(['TYPE', counter]), 'string');
      const before = env.redis(['GET', counter]);
      assert.deepEqual(await locker.inspect(counter), { held: false });
      assert.deepEqual(await locker.list({ prefix: counter }), []);
      assert.equal(await locker.forceRelease(counter), false);
      assert.equal(env.redis(['GET', counter]), before);
      assert.ok(Number(env.redis(['PTTL', counter])) > 0);
      assert.equal(await lock.isHeld(), true);
      await lock.release();
    });

    it('a real lock is still removed, and its queued waiter gets the key', async () => {
      const key = unique('held');
      const other = new Locker({ adapter });
      const lock = await locker.acquire(key, { ttl: 20_000, holder: 'stuck job' });
      const waiting = other.acquire(key, { ttl: 5000, retry: { retries: Infinity, delay: 100, timeout: 10_000 } });
      await sleep(300);
      assert.equal((await locker.inspect(key)).held, true);
      assert.deepEqual((await locker.list({ prefix: key })).map((k) => [k.key, k.holder]), [[key, 'stuck job']]);
      assert.equal(await locker.forceRelease(key), true);
      const won = await waiting;
      assert.equal(await won.isHeld(), true);
      assert.equal(await lock.isHeld(), false);
      await won.release();
      await other.close();
    });

    it('a key reserved for a waiter has no holder: not held, and forceRelease leaves the reservation', async () => {
      const key = unique('reserved');
      env.redis(['SET', key, 'locco:reserved|chan|w1', 'PX', '60000']);
      assert.deepEqual(await locker.inspect(key), { held: false });
      assert.deepEqual(await locker.list({ prefix: key }), []);
      assert.equal(await locker.forceRelease(key), false);
      assert.equal(env.redis(['GET', key]), 'locco:reserved|chan|w1');
    });
  });
}

describe('locco-rs release --force on Redis', () => {
  let server;
  before(async () => {
    server = await startRedis();
  });
  after(() => server.dispose());

  for (const [what, write] of foreign) {
    it(`${what}: the dry run and the forced release agree that it is not held; the key is left`, async () => {
      const key = unique('cli');
      for (const cmd of write(key)) server.cli(...cmd);
      const before = snapshot((cmd) => server.cli(...cmd), key);
      const dry = await cli(['release', '--url', server.url, '--key', key]);
      assert.equal(dry.code, 2, dry.stderr);
      assert.match(dry.stdout + dry.stderr, /is not held now; nothing would be removed/);
      const forced = await cli(['release', '--url', server.url, '--key', key, '--force']);
      assert.equal(forced.code, 1, `${forced.stdout}${forced.stderr}`);
      assert.match(forced.stdout, /nothing was released/);
      assert.doesNotMatch(forced.stdout + forced.stderr, /^released|WRONGTYPE|script/im);
      assert.deepEqual(snapshot((cmd) => server.cli(...cmd), key), before, 'the application key was changed');
    });
  }

  it('a held lock is released by force (exit 0), as before', async () => {
    const key = unique('cli-held');
    const adapter = new RedisAdapter({ url: server.url });
    const locker = new Locker({ adapter });
    const lock = await locker.acquire(key, { ttl: 20_000, holder: 'cron' });
    const forced = await cli(['release', '--url', server.url, '--key', key, '--force']);
    assert.equal(forced.code, 0, `${forced.stdout}${forced.stderr}`);
    assert.match(forced.stdout, /^released .* held by "cron"/);
    assert.equal(server.cli('EXISTS', key), '0');
    assert.equal(await lock.isHeld(), false);
    await locker.close();
    await adapter.close();
  });
});
