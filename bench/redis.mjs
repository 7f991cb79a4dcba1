// Redis: locco-rs against a floor written with ioredis (SET NX PX + EVALSHA compare-and-delete),
// same process, same server, same run; median of 3.
// W1: 5,000 sequential acquire+release pairs on distinct keys.
// W2: 256 concurrent workers, each looping acquire+release on its own key for 5 s.
import { randomBytes } from 'node:crypto';
import Redis from 'ioredis';
import { Locker } from '../index.mjs';
import { runBackendBench } from './pairs.mjs';
import { RedisAdapter } from '../redis.mjs';
import { startRedis } from '../__test__/support/servers.mjs';

const W1_PAIRS = 5_000;
const W2_WORKERS = 256;
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 5);
const TTL = 10_000;

const RELEASE = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`;

function floor(url) {
  const client = new Redis(url, { lazyConnect: false });
  client.defineCommand('loccoRelease', { numberOfKeys: 1, lua: RELEASE });
  return {
    async pair(key) {
      const token = randomBytes(16).toString('hex');
      const ok = await client.set(key, token, 'PX', TTL, 'NX');
      if (ok !== 'OK') throw new Error('floor: key held');
      await client.loccoRelease(key, token);
    },
    close: () => client.quit(),
  };
}


const server = await startRedis();
const peer = floor(server.url);
const adapter = new RedisAdapter({ url: server.url });
await runBackendBench({
  Locker,
  adapter,
  peer,
  server,
  ttl: TTL,
  floorName: 'ioredis',
  w1Pairs: W1_PAIRS,
  w2Workers: W2_WORKERS,
  w2Seconds: W2_SECONDS,
});
