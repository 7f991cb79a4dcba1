// Every file in examples/ runs with `node examples/<file>` and does what it says: the in-memory
// ones as they are, the network ones against servers the test starts, their URL in the env var
// the example documents.
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { runNode } from '../support/run-node.mjs';
import { startMongo, startPostgres, startRedis } from '../support/servers.mjs';

/** Runs `node examples/<file>` from the repository root; answers { code, stdout, stderr }. */
const runExample = (file, env = {}) => runNode([`examples/${file}`], { env });

async function expectRun(file, env, patterns) {
  const r = await runExample(file, env);
  assert.equal(r.code, 0, `${file} exited ${r.code}\n${r.stdout}\n${r.stderr}`);
  for (const p of patterns) assert.match(r.stdout, p, `${file} printed:\n${r.stdout}`);
  return r;
}

const expected = {
  'memory.mjs': [/second acquire refused: LOCK_HELD/, /after release, tryAcquire got the key: true/],
  'leader-election.mjs': [/node-\w is the leader \(term 1\)/, /terms: node-\w -> node-\w/],
  'fenced-write.mjs': [/A's lease: lost \(expired\)/, /B writes with fence 2: accepted/, /A writes with fence 1: refused/],
  'job-dedup.mjs': [/ran: w\d:1, w\d:2\n/, /w1: job 1 is taken, skipped/],
  'mutex-manager.mjs': [/results: 10, -5, 7/, /MUTEX_TIMEOUT after 20 ms/],
  'redis.mjs': [/holding locco-example:invoice:42 with fence \d+/, /tryAcquire after release: got it/],
  'postgres.mjs': [/holding report:monthly with fence 1/, /a second holder gets: null/, /expired rows removed: 0/],
  'mongo.mjs': [/holding export:users/, /released/],
  'opentelemetry.mjs': [
    /the second caller waited for the first/,
    /cache:warm was lost \(extend-failed\)/,
    /released on the second try: true/,
    /metrics go to @opentelemetry\/api/,
    /locco\.lock\.wait\.duration\{locco\.key\.group=report\} 3 values, max 0\.(1\d\d|[2-9]\d\d) s/,
    /locco\.lock\.contended\{locco\.key\.group=report,locco\.contended\.reason=held\} [1-9]/,
    /locco\.lock\.hold\.duration\{locco\.key\.group=cache,locco\.lock\.outcome=lost\} 1 values/,
    /locco\.lock\.hold\.duration\{locco\.key\.group=report,locco\.lock\.outcome=released\} 3 values/,
    /locco\.lock\.lost\{locco\.key\.group=cache,locco\.lost\.reason=extend-failed\} 1\n/,
    /locco\.backend\.errors\{locco\.key\.group=cache,locco\.operation=extend\} [1-9]/,
    /locco\.backend\.errors\{locco\.key\.group=report,locco\.operation=release\} 1\n/,
  ],
};

it('every example has a check here', () => {
  assert.deepEqual(readdirSync(new URL('../../examples', import.meta.url)).sort(), Object.keys(expected).sort());
});

for (const file of ['memory.mjs', 'leader-election.mjs', 'fenced-write.mjs', 'job-dedup.mjs', 'mutex-manager.mjs', 'opentelemetry.mjs']) {
  it(`node examples/${file}`, () => expectRun(file, {}, expected[file]));
}

// One server per example, each started by the test on a free port and stopped afterwards.
const network = [
  ['redis.mjs', 'REDIS_URL', startRedis],
  ['postgres.mjs', 'DATABASE_URL', startPostgres],
  ['mongo.mjs', 'MONGO_URL', startMongo],
];
for (const [file, variable, start] of network) {
  describe(`node examples/${file}`, () => {
    let server;
    before(async () => {
      server = await start();
    });
    after(() => server?.dispose());
    it(`${variable}=<test server> node examples/${file}`, async () => {
      const r = await expectRun(file, { [variable]: server.url }, expected[file]);
      assert.doesNotMatch(r.stdout, /postgres-pw/, 'the example printed a password');
    });
  });
}
