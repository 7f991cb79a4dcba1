// MongoDB backend. The URL comes from MONGO_URL (default mongodb://127.0.0.1:27017).
// The adapter creates its indexes on first use unless you pass createIndexes: false.
// Run: MONGO_URL=mongodb://127.0.0.1:27017 node examples/mongo.mjs
// Node.js 24 or newer: it uses `await using` (see the README for Node 22).
import { Locker } from 'locco-rs';
import { MongoAdapter } from 'locco-rs/mongo';

const url = process.env.MONGO_URL ?? 'mongodb://127.0.0.1:27017';
console.log(`MongoDB at ${url.replace(/\/\/[^@/]*@/, '//***@')} (set MONGO_URL to change it)`);

await using adapter = new MongoAdapter({ url, dbName: 'locco_example', connectTimeout: 2_000 });
const locker = new Locker({ adapter });

await locker.withLock('export:users', { ttl: 10_000 }, async (lock) => {
  console.log(`holding ${lock.key}; held for ${Math.round(lock.heldMs)} ms so far`);
});
console.log('released');
