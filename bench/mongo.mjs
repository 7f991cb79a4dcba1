// MongoDB: locco-rs against a floor written with the `mongodb` npm driver (the same pipeline
// upsert against $$NOW and token-checked delete), same process, same server, same run.
// W1: sequential pairs on distinct keys. W2: 64 concurrent workers on their own keys.
import { randomBytes } from 'node:crypto';
import { MongoClient } from 'mongodb';
import { Locker } from 'locco-rs';
import { MongoAdapter } from 'locco-rs/mongo';
import { runBackendBench } from './pairs.mjs';
import { startMongo } from '../__test__/support/servers.mjs';

const W1_PAIRS = Number(process.env.W1_PAIRS ?? 1_000);
const W2_WORKERS = 64;
const W2_SECONDS = Number(process.env.W2_SECONDS ?? 5);
const TTL = 10_000;

async function floor(url) {
  const client = new MongoClient(url, { writeConcern: { w: 'majority' } });
  await client.connect();
  const locks = client.db('bench').collection('floor-locks');
  await locks.createIndex({ key: 1 }, { unique: true });
  const free = { $or: [{ $eq: [{ $type: '$expireAt' }, 'missing'] }, { $lte: ['$expireAt', '$$NOW'] }] };
  return {
    async pair(key) {
      const token = randomBytes(16).toString('hex');
      const doc = await locks.findOneAndUpdate(
        { key },
        [
          {
            $set: {
              uniqueValue: { $cond: [free, token, '$uniqueValue'] },
              expireAt: { $cond: [free, { $toDate: { $add: [{ $toLong: '$$NOW' }, TTL] } }, '$expireAt'] },
            },
          },
        ],
        { upsert: true, returnDocument: 'after', projection: { uniqueValue: 1 } },
      );
      if (doc?.uniqueValue !== token) throw new Error('floor: key held');
      await locks.deleteOne({ key, uniqueValue: token, $expr: { $gt: ['$expireAt', '$$NOW'] } });
    },
    close: () => client.close(),
  };
}

const server = await startMongo();
const peer = await floor(server.url);
const adapter = new MongoAdapter({ url: server.url, dbName: 'bench' });
await runBackendBench({
  Locker,
  adapter,
  peer,
  server,
  ttl: TTL,
  floorName: 'mongodb',
  w1Pairs: W1_PAIRS,
  w2Workers: W2_WORKERS,
  w2Seconds: W2_SECONDS,
});
