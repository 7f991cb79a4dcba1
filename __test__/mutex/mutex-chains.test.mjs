// Which holds a wait stands for: those of the operations it is nested in (in its own context),
// not every hold of every operation that shares its context token. False cycles are not
// reported; real ones still are, in one process and across processes.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MutexManager, MutexDeadlockError, MutexTimeoutError } from 'locco-rs/mutex';
import { startRedis } from '../support/servers.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
/** A promise and the function that settles it. */
const gate = () => {
  let open;
  const opened = new Promise((r) => (open = r));
  return { opened, open };
};

/**
 * Work scheduled from inside callbacks, fire and forget, as an event handler would: A holds
 * alpha for 30 ms and waits for nothing. From inside it, work in B takes beta, and from inside
 * that, work in C waits for alpha and work in A (not nested in A's holder) waits for beta.
 * Meanwhile work in B that holds delta waits for alpha. Nothing is stuck. Answers the events.
 */
async function cascade(m) {
  const [a, b, c] = [m.createContext(), m.createContext(), m.createContext()];
  const events = [];
  const running = new Map();
  const pending = new Set();
  const schedule = (label, id, context, work, then = () => {}) => {
    const task = m
      .runOperation(
        id,
        async () => {
          if (running.get(id)) events.push(`overlap:${label}`);
          running.set(id, true);
          events.push(`start:${label}`);
          then();
          await sleep(work);
          events.push(`end:${label}`);
          running.set(id, false);
        },
        { context, timeoutMs: 2000 },
      )
      .catch((error) => events.push(`error:${label}:${error.name}`));
    pending.add(task);
  };
  schedule('a-alpha', 'alpha', a, 30, () =>
    schedule('b-beta', 'beta', b, 25, () => {
      schedule('c-alpha', 'alpha', c, 10);
      setTimeout(() => schedule('a-beta', 'beta', a, 10), 5);
    }),
  );
  schedule('b-delta', 'delta', b, 15, () => schedule('b-alpha', 'alpha', b, 10));
  while (pending.size > 0) {
    const now = [...pending];
    pending.clear();
    await Promise.all(now);
  }
  return events;
}

function assertAllRan(events) {
  assert.deepEqual(
    events.filter((e) => e.startsWith('error:') || e.startsWith('overlap:')),
    [],
  );
  for (const label of ['a-alpha', 'b-beta', 'c-alpha', 'a-beta', 'b-delta', 'b-alpha']) {
    assert.ok(events.includes(`end:${label}`), `${label} ran: ${events.join(' ')}`);
  }
}

describe('MutexManager: waits of work scheduled with manual contexts', () => {
  it('makes no false cycle when scheduled work shares a context with a holder that never waits', async () => {
    assertAllRan(await cascade(new MutexManager()));
  });

  it('still reports a real cycle between two contexts passed by hand, at once', async () => {
    const m = new MutexManager();
    const [a, b] = [m.createContext(), m.createContext()];
    const bHolds = gate();
    const aWaits = gate();
    const run = (first, second, context, before) =>
      m
        .runOperation(
          first,
          async ({ contextToken }) => {
            await before();
            return m.runOperation(second, () => `${first} then ${second}`, { context: contextToken });
          },
          { context },
        )
        .catch((error) => error);
    const started = Date.now();
    const ra = run('alpha', 'beta', a, () => bHolds.opened);
    const rb = run('beta', 'alpha', b, async () => {
      bHolds.open();
      await aWaits.opened;
    });
    await sleep(20); // A waits for beta by now
    aWaits.open();
    const outcomes = await Promise.all([ra, rb]);
    const errors = outcomes.filter((o) => o instanceof MutexDeadlockError);
    assert.equal(errors.length, 1, String(outcomes));
    assert.deepEqual(new Set(errors[0].cycle), new Set(['alpha', 'beta']));
    assert.ok(Date.now() - started < 1000);
  });

  it('still reports a real cycle without AsyncLocalStorage, contexts passed across awaits', async () => {
    const m = new MutexManager({ asyncContextTracking: false });
    const bHolds = gate();
    const aWaits = gate();
    const ra = m
      .runOperation('alpha', async ({ contextToken }) => {
        await bHolds.opened;
        return m.runOperation('beta', () => 'a', { context: contextToken });
      })
      .catch((e) => e);
    const rb = m
      .runOperation('beta', async ({ contextToken }) => {
        bHolds.open();
        await aWaits.opened;
        return m.runOperation('alpha', () => 'b', { context: contextToken });
      })
      .catch((e) => e);
    await sleep(20);
    aWaits.open();
    const outcomes = await Promise.all([ra, rb]);
    const errors = outcomes.filter((o) => o instanceof MutexDeadlockError);
    assert.equal(errors.length, 1, String(outcomes));
    assert.deepEqual(new Set(errors[0].cycle), new Set(['alpha', 'beta']));
  });
});

describe('MutexManager: wait-for records across processes', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis.dispose());

  it('makes no false cycle on a distributed manager either', async () => {
    const m = new MutexManager({ redis: { url: redis.url }, namespace: 'cascade' });
    try {
      assertAllRan(await cascade(m));
    } finally {
      await m.dispose();
    }
  });

  it('a wait of one operation stays visible while another operation of its context waits too', async () => {
    const opts = { redis: { url: redis.url }, namespace: 'records', lockTTL: 5000 };
    const [m1, m2] = [new MutexManager(opts), new MutexManager(opts)];
    // Contexts in this order leave the report of the cycle to the second manager when the
    // first one is the only one that can see it: the test then shows whether it can.
    let a = m1.createContext();
    let b = m2.createContext();
    while (!(a.id < b.id)) [a, b] = [m1.createContext(), m2.createContext()];
    const gates = { xWaits: gate(), yWaits: gate(), zDone: gate(), qWaits: gate() };
    const zHolds = gate();
    const qHolds = gate();
    // Z (no context of ours) holds delta until told; Q (context B) holds beta.
    const z = m2.runOperation('delta', async () => {
      zHolds.open();
      await gates.zDone.opened;
    });
    const q = m2
      .runOperation(
        'beta',
        async () => {
          qHolds.open();
          await gates.qWaits.opened;
          return m2.runOperation('alpha', () => 'q got alpha', { timeoutMs: 4000 });
        },
        { context: b },
      )
      .catch((e) => e);
    await Promise.all([zHolds.opened, qHolds.opened]);
    // X (context A) holds alpha and waits for beta.
    const x = m1
      .runOperation(
        'alpha',
        async () => {
          await gates.xWaits.opened;
          return m1.runOperation('beta', () => 'x got beta', { timeoutMs: 4000 });
        },
        { context: a },
      )
      .catch((e) => e);
    // Y (context A too, another operation) holds gamma and waits for delta, which comes soon.
    const y = m1.runOperation(
      'gamma',
      async () => {
        await gates.yWaits.opened;
        return m1.runOperation('delta', () => 'y got delta', { timeoutMs: 4000 });
      },
      { context: a },
    );
    await sleep(30);
    gates.xWaits.open();
    await sleep(100); // X waits and has said so
    gates.yWaits.open();
    await sleep(100); // Y waits too
    gates.zDone.open();
    assert.equal(await y, 'y got delta');
    await z;
    // Now Q closes the cycle: X holds alpha and waits for beta, which Q holds.
    const started = Date.now();
    gates.qWaits.open();
    const outcomes = await Promise.all([x, q]);
    const deadlocks = outcomes.filter((o) => o instanceof MutexDeadlockError);
    assert.equal(
      deadlocks.length,
      1,
      `one wait gives way: ${outcomes.map((o) => (o instanceof Error ? o.name : o)).join(', ')}`,
    );
    assert.ok(!outcomes.some((o) => o instanceof MutexTimeoutError));
    assert.deepEqual(new Set(deadlocks[0].cycle), new Set(['alpha', 'beta']));
    assert.ok(Date.now() - started < 2000, 'reported promptly');
    assert.ok(outcomes.some((o) => typeof o === 'string'), 'the other wait went on');
    await Promise.all([m1.dispose(), m2.dispose()]);
  });

  it('files a wait under the locks it stands for, and takes it out when the wait ends', async () => {
    const opts = { redis: { url: redis.url }, namespace: 'filed', lockTTL: 5000 };
    const [m1, m2] = [new MutexManager(opts), new MutexManager(opts)];
    const release = gate();
    const holding = gate();
    const holder = m2.runOperation('b', async () => {
      holding.open();
      await release.opened;
    });
    await holding.opened;
    let outerToken;
    const nested = m1.runOperation('a', async () => {
      outerToken = redis.cli('GET', 'uniquemutex-v2:filed:a');
      return m1.runOperation('b', () => 'after b', { timeoutMs: 4000 });
    });
    await sleep(100);
    const record = JSON.parse(redis.cli('GET', `locco-meta:wait:${outerToken}`));
    assert.equal(record.length, 1);
    assert.equal(record[0].id, 'b');
    assert.equal(record[0].key, 'uniquemutex-v2:filed:b');
    release.open();
    assert.equal(await nested, 'after b');
    await holder;
    await sleep(50); // the record is taken out without holding up the caller
    assert.equal(redis.cli('EXISTS', `locco-meta:wait:${outerToken}`), '0');
    await Promise.all([m1.dispose(), m2.dispose()]);
  });
});
