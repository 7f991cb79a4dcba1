// Redis: locco-rs against a floor written with ioredis (SET NX PX + EVALSHA compare-and-delete),
// same process, same server, same run; median of 3.
// W1: 5,000 sequential acquire+release pairs on distinct keys.
// W2: 256 concurrent workers, each looping acquire+release on its own key for 5 s.
// A bare client (the same two commands written by hand over one socket) is measured beside
// both: the most any client in this process could do here.
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import Redis from 'ioredis';
import { Locker } from 'locco-rs';
import { runBackendBench } from './pairs.mjs';
import { RedisAdapter } from 'locco-rs/redis';
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

/**
 * RESP by hand: one socket, requests written as they come, replies matched in order. It reads
 * the reply types these commands get: a line (+OK, :n, $-1, -ERR) or a bulk string (the sha).
 */
async function bare(url) {
  const { hostname, port } = new URL(url);
  const sock = net.connect(Number(port), hostname);
  sock.setNoDelay(true);
  await new Promise((resolve, reject) => sock.once('connect', resolve).once('error', reject));
  const waiting = [];
  let rest = '';
  sock.setEncoding('latin1');
  sock.on('data', (chunk) => {
    rest += chunk;
    let at;
    while ((at = rest.indexOf('\r\n')) !== -1) {
      let reply = rest.slice(0, at);
      let end = at + 2;
      if (reply[0] === '$' && reply !== '$-1') {
        end += Number(reply.slice(1)) + 2;
        if (rest.length < end) return;
        reply = rest.slice(at + 2, end - 2);
      }
      rest = rest.slice(end);
      const { resolve, reject } = waiting.shift();
      if (reply[0] === '-') reject(new Error(`bare: ${reply}`));
      else resolve(reply);
    }
  });
  const send = (...args) =>
    new Promise((resolve, reject) => {
      waiting.push({ resolve, reject });
      sock.write(`*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`);
    });
  const sha = await send('SCRIPT', 'LOAD', RELEASE);
  return {
    async pair(key) {
      const token = randomBytes(16).toString('hex');
      if ((await send('SET', key, token, 'PX', String(TTL), 'NX')) !== '+OK') throw new Error('bare: key held');
      await send('EVALSHA', sha, '1', key, token);
    },
    close: () => sock.end(),
  };
}

const server = await startRedis();
const peer = floor(server.url);
const adapter = new RedisAdapter({ url: server.url });
await runBackendBench({
  Locker,
  adapter,
  peer,
  bare: await bare(server.url),
  server,
  ttl: TTL,
  floorName: 'ioredis',
  w1Pairs: W1_PAIRS,
  w2Workers: W2_WORKERS,
  w2Seconds: W2_SECONDS,
});
