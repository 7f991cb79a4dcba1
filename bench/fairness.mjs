// Fairness on one contended key: 8 processes (bench/fairness-child.mjs), all on ONE key, each
// looping acquire → release with an empty critical section for FAIRNESS_SECONDS (default 5).
// Subjects: locco-rs with fencing, and a floor that polls every 10 ms (ioredis on Redis, pg on
// PostgreSQL), same server, same run; 3 rounds, the order alternating; each column is the
// median of its 3 values.
// Per run: grants/s; owner change % (consecutive grants, in fence order, whose processes
// differ); busiest share (% of grants the busiest process took); p99 and max wait (call of
// acquire to grant). Mutual exclusion is checked too: fences unique, holds never overlapping.
// Run: node bench/fairness.mjs [redis|postgres ...]   (default both)
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { postgresLocksDdl } from 'locco-rs/postgres';
import { startPostgres, startRedis } from '../__test__/support/servers.mjs';

const SECONDS = Number(process.env.FAIRNESS_SECONDS ?? 5);
const PROCESSES = 8;
const ROUNDS = 3;
const TTL = 10_000;
const CHILD = fileURLToPath(new URL('./fairness-child.mjs', import.meta.url));

const BACKENDS = {
  redis: {
    title: 'Redis',
    floorName: 'ioredis',
    start: () => startRedis(),
    prepare() {},
    targets: (o, ratio) => [
      ['owner change >= 90%', o.ownerChange >= 90, `${o.ownerChange.toFixed(1)} %`],
      ['busiest process <= 15% of grants', o.busiest <= 15, `${o.busiest.toFixed(1)} %`],
      ['p99 wait <= 10 ms', o.p99 <= 10, `${o.p99.toFixed(2)} ms`],
      ['max wait <= 50 ms', o.max <= 50, `${o.max.toFixed(2)} ms`],
      ['grants/s >= 0.5x floor', ratio >= 0.5, `${ratio.toFixed(2)}x`],
    ],
  },
  postgres: {
    title: 'PostgreSQL',
    floorName: 'pg',
    start: () => startPostgres(),
    // Made before the children start: eight first uses at once would race to create them.
    prepare(server) {
      server.psql(
        postgresLocksDdl() +
          '\nCREATE TABLE IF NOT EXISTS floor_locks (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL);' +
          '\nCREATE SEQUENCE IF NOT EXISTS floor_fence;',
      );
    },
    targets: (o) => [
      ['owner change >= 90%', o.ownerChange >= 90, `${o.ownerChange.toFixed(1)} %`],
      ['max wait <= 100 ms', o.max <= 100, `${o.max.toFixed(2)} ms`],
    ],
  },
};

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const percentile = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
const fmt = (n) => Math.round(n).toLocaleString('en-US');

/** Resolves with the first message of `child` that `pick` accepts; rejects if it exits first. */
function receive(child, pick) {
  return new Promise((resolve, reject) => {
    const onMessage = (m) => {
      if (!pick(m)) return;
      child.off('exit', onExit);
      child.off('message', onMessage);
      resolve(m);
    };
    const onExit = (code, signal) => reject(new Error(`a contender exited early (code ${code}, signal ${signal})`));
    child.on('message', onMessage);
    child.once('exit', onExit);
  });
}

/** One run: PROCESSES children of one subject on `key`; answers the run's statistics. */
async function run({ backend, subject, url, key }) {
  // Every process measures from this origin on the machine's monotonic clock.
  const base = process.hrtime.bigint();
  const now = () => Number(process.hrtime.bigint() - base) / 1e6;
  const children = Array.from({ length: PROCESSES }, (_, id) =>
    fork(CHILD, [JSON.stringify({ backend, subject, url, key, id, ttl: TTL, base: String(base) })], {
      execPath: process.execPath,
    }),
  );
  const exits = children.map((c) => new Promise((r) => c.once('exit', (code) => r(code))));
  try {
    await Promise.all(children.map((c) => receive(c, (m) => m === 'ready')));
    const results = children.map((c) => receive(c, (m) => m?.records !== undefined));
    const start = now();
    for (const c of children) c.send({ go: start + SECONDS * 1000 });
    const reports = await Promise.all(results);
    const codes = await Promise.all(exits);
    const failures = reports.map((r) => r.failure).filter(Boolean);
    codes.forEach((code, id) => code !== 0 && failures.push(`process ${id} exited with code ${code}`));
    return measure(reports, start, failures);
  } finally {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill();
  }
}

/** The statistics of one run from the children's grant records. */
function measure(reports, start, failures) {
  const grants = reports.flatMap((r, owner) =>
    r.records.map(([fence, wait, acquired, releasing]) => ({ owner, fence, wait, acquired, releasing })),
  );
  // Fence order is grant order: the fence is taken in the same atomic step as the grant.
  grants.sort((a, b) => a.fence - b.fence);
  let changes = 0;
  for (let i = 1; i < grants.length; i++) {
    const [prev, cur] = [grants[i - 1], grants[i]];
    if (cur.fence === prev.fence) failures.push(`duplicate fence ${cur.fence} (processes ${prev.owner}, ${cur.owner})`);
    // A grant seen by its holder must come after the previous holder began to release, or
    // two processes held the key at once.
    else if (cur.acquired < prev.releasing) failures.push(`fence ${cur.fence} acquired before fence ${prev.fence} was released`);
    if (cur.owner !== prev.owner) changes++;
  }
  const perProcess = reports.map((r) => r.records.length);
  const waits = grants.map((g) => g.wait).sort((a, b) => a - b);
  const elapsed = Math.max(...reports.map((r) => r.end)) - start;
  return {
    rate: grants.length / (elapsed / 1000),
    ownerChange: grants.length > 1 ? (100 * changes) / (grants.length - 1) : 0,
    busiest: grants.length ? (100 * Math.max(...perProcess)) / grants.length : 0,
    p99: percentile(waits, 99) ?? 0,
    max: waits.at(-1) ?? 0,
    grants: grants.length,
    gaveUp: reports.reduce((n, r) => n + r.gaveUp, 0),
    failures: failures.slice(0, 5),
  };
}

const describe = (r) =>
  `${fmt(r.rate)} grants/s, owner change ${r.ownerChange.toFixed(1)} %, busiest ${r.busiest.toFixed(1)} %, ` +
  `p99 ${r.p99.toFixed(2)} ms, max ${r.max.toFixed(2)} ms` +
  (r.gaveUp ? `, ${r.gaveUp} gave up` : '');

async function bench(name) {
  const backend = BACKENDS[name];
  const server = await backend.start();
  const runs = { locco: [], floor: [] };
  const label = { locco: 'locco-rs', floor: backend.floorName };
  let exclusionFailed = false;
  try {
    backend.prepare(server);
    console.log(`${backend.title}: ${PROCESSES} processes on one key for ${SECONDS} s, ${ROUNDS} rounds`);
    for (let round = 0; round < ROUNDS; round++) {
      // Alternate who goes first, so neither always gets the fresher server.
      const order = round % 2 === 0 ? ['locco', 'floor'] : ['floor', 'locco'];
      for (const subject of order) {
        const r = await run({ backend: name, subject, url: server.url, key: `fairness:${subject}:${round}` });
        runs[subject].push(r);
        console.log(`  round ${round + 1} ${label[subject].padEnd(8)} ${describe(r)}`);
        for (const f of r.failures) console.log(`  FAIL mutual exclusion: ${f}`);
        if (r.failures.length) exclusionFailed = true;
      }
    }
  } finally {
    await server.dispose();
  }

  const med = (subject) => {
    const rows = runs[subject];
    const m = {};
    for (const field of ['rate', 'ownerChange', 'busiest', 'p99', 'max', 'gaveUp']) m[field] = median(rows.map((r) => r[field]));
    return m;
  };
  const o = med('locco');
  const f = med('floor');
  const ratio = o.rate / f.rate;
  console.log(`  median of ${ROUNDS}     grants/s  owner change  busiest   p99 wait   max wait`);
  for (const [subject, m] of [['locco', o], ['floor', f]]) {
    console.log(
      `  ${label[subject].padEnd(12)} ${fmt(m.rate).padStart(11)} ${m.ownerChange.toFixed(1).padStart(11)} % ` +
        `${m.busiest.toFixed(1).padStart(6)} % ${m.p99.toFixed(2).padStart(8)} ms ${m.max.toFixed(2).padStart(8)} ms`,
    );
  }
  console.log(`  ratio        ${ratio.toFixed(2).padStart(10)}x  (grants/s, locco-rs / ${backend.floorName})`);
  console.log(`  targets (locco-rs):`);
  for (const [what, ok, value] of backend.targets(o, ratio)) console.log(`    ${ok ? 'PASS' : 'FAIL'}  ${what}: ${value}`);
  console.log(JSON.stringify({ backend: name, ratio, locco: o, floor: f, exclusionFailed }));
  return exclusionFailed;
}

const chosen = process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(BACKENDS);
for (const name of chosen) if (!BACKENDS[name]) throw new Error(`unknown backend ${name}: redis or postgres`);
for (const name of chosen) {
  // A miss on a target is a result; two holders at once is a bug, so that exits non-zero.
  if (await bench(name)) process.exitCode = 1;
}
