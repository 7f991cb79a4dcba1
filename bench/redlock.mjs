// Redlock over 5 independent redis-server processes: the Locker over RedlockAdapter against a
// floor written with ioredis on the same servers (SET NX PX sent to all five at once, granted
// at a majority, compare-and-delete sent to all five on release), same process, same run;
// median of 3.
// W1: 2,000 sequential acquire+release pairs on distinct keys.
// W2: 64 concurrent workers, each looping on its own key for 5 s. Fewer workers than the Redis
// benchmark's 256: every pair here is ten commands over five servers, and the five
// redis-server processes share the machine's two cores with the benchmark, so 256 workers
// only measure queueing in the servers.
import { randomBytes } from 'node:crypto';
import Redis from 'ioredis';
import { Locker } from 'locco-rs';
import { runBackendBench } from './pairs.mjs';
import { RedlockAdapter } from 'locco-rs/redis';
import { startRedis } from '../__test__/support/servers.mjs';

const SERVERS = 5;
const W1_PAIRS = 2_000;
const W2_WORKERS = Number(process.env.W2_WORKERS ?? 64);
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 5);
const TTL = 10_000;
const DRIFT = Math.ceil(TTL / 100) + 2;

const RELEASE = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`;

/** Resolves true once `need` of `promises` resolved truthy, false once that cannot happen. */
function majority(promises, need) {
  return new Promise((resolve) => {
    let yes = 0;
    let settled = 0;
    for (const p of promises) {
      p.then(
        (v) => v,
        () => false,
      ).then((v) => {
        settled++;
        if (v) yes++;
        if (yes >= need) resolve(true);
        else if (yes + (promises.length - settled) < need) resolve(false);
      });
    }
  });
}

function floor(urls) {
  const clients = urls.map((url) => {
    const c = new Redis(url, { lazyConnect: false });
    c.defineCommand('loccoRelease', { numberOfKeys: 1, lua: RELEASE });
    return c;
  });
  const need = Math.floor(clients.length / 2) + 1;
  const releaseAll = (key, token) => clients.map((c) => c.loccoRelease(key, token).then((n) => n === 1));
  return {
    async pair(key) {
      const token = randomBytes(16).toString('hex');
      const started = performance.now();
      const granted = await majority(
        clients.map((c) => c.set(key, token, 'PX', TTL + DRIFT, 'NX').then((ok) => ok === 'OK')),
        need,
      );
      if (!granted || TTL - (performance.now() - started) - DRIFT <= 0) {
        await majority(releaseAll(key, token), need);
        throw new Error('floor: no majority');
      }
      if (!(await majority(releaseAll(key, token), need))) throw new Error('floor: release found no majority');
    },
    close: () => Promise.all(clients.map((c) => c.quit())),
  };
}

const servers = await Promise.all(Array.from({ length: SERVERS }, () => startRedis()));
const urls = servers.map((s) => s.url);
const peer = floor(urls);
const adapter = new RedlockAdapter({ urls });
await runBackendBench({
  Locker,
  adapter,
  peer,
  server: { dispose: () => Promise.all(servers.map((s) => s.dispose())) },
  ttl: TTL,
  floorName: 'ioredis',
  w1Pairs: W1_PAIRS,
  w2Workers: W2_WORKERS,
  w2Seconds: W2_SECONDS,
});
