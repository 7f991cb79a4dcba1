import assert from 'node:assert/strict';
import { fork } from 'node:child_process';
import { after, before, describe, it } from 'node:test';
import { Worker } from 'node:worker_threads';
import { MutexManager, MutexAbortedError } from 'locco-rs/mutex';
import { startRedis } from '../support/servers.mjs';

const CHILD = new URL('../support/mutex-child.mjs', import.meta.url);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function child(args) {
  const proc = fork(CHILD, [JSON.stringify(args)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const messages = [];
  const waiters = [];
  proc.on('message', (m) => {
    messages.push(m);
    waiters.splice(0).forEach((w) => w());
  });
  const next = async (pred, ms = 10_000) => {
    const end = Date.now() + ms;
    for (;;) {
      const found = messages.find(pred);
      if (found !== undefined) return found;
      if (Date.now() > end) throw new Error(`no such message from the child: ${JSON.stringify(messages)}`);
      await new Promise((r) => {
        waiters.push(r);
        setTimeout(r, 100);
      });
    }
  };
  return { proc, messages, next };
}

describe('MutexManager across processes and threads', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis.dispose());

  it('reports a deadlock spanning two processes to one of them within a second, with the cycle', async () => {
    const a = child({ url: redis.url, role: 'cross', first: 'alpha', second: 'beta' });
    const b = child({ url: redis.url, role: 'cross', first: 'beta', second: 'alpha' });
    await a.next((m) => m === 'holding');
    await b.next((m) => m === 'holding');
    const started = Date.now();
    a.proc.send('go');
    b.proc.send('go');
    const [ra, rb] = await Promise.all([a.next((m) => typeof m === 'object'), b.next((m) => typeof m === 'object')]);
    const errors = [ra, rb].filter((r) => r.error);
    assert.equal(errors.length, 1, JSON.stringify([ra, rb]));
    assert.equal(errors[0].error.name, 'MutexDeadlockError');
    assert.deepEqual(new Set(errors[0].error.cycle), new Set(['alpha', 'beta']));
    assert.ok(Date.now() - started < 1000 + 500, 'reported promptly');
    assert.ok([ra, rb].some((r) => typeof r.result === 'string'), 'the other process went on');
  });

  it('a holder killed with SIGKILL frees its mutex when its lease ends', async () => {
    const holder = child({ url: redis.url, role: 'hold', id: 'killed', lockTTL: 1000 });
    await holder.next((m) => m === 'held');
    holder.proc.kill('SIGKILL');
    const manager = new MutexManager({ redis: { url: redis.url }, namespace: 'cross', lockTTL: 1000 });
    const started = Date.now();
    assert.equal(await manager.runOperation('killed', () => 'mine now', { timeoutMs: 5000 }), 'mine now');
    assert.ok(Date.now() - started < 3000);
    await manager.dispose();
  });

  it('serialises a process, a worker thread and the main thread on one id', async () => {
    const log = [];
    const record = (m) => {
      if (m && m.enter) log.push(`+${m.enter}`);
      if (m && m.leave) log.push(`-${m.leave}`);
    };
    const proc = child({ url: redis.url, role: 'serial', id: 'shared', n: 5, tag: 'p' });
    proc.proc.on('message', record);
    const worker = new Worker(CHILD, { workerData: { url: redis.url, role: 'serial', id: 'shared', n: 5, tag: 'w' } });
    const workerDone = new Promise((resolve, reject) => {
      worker.on('message', (m) => (m === 'done' ? resolve() : record(m)));
      worker.on('error', reject);
    });
    const manager = new MutexManager({ redis: { url: redis.url }, namespace: 'cross', lockTTL: 2000 });
    for (let i = 0; i < 5; i++) {
      await manager.runOperation('shared', async () => {
        log.push('+m');
        await sleep(2);
        log.push('-m');
      });
    }
    await Promise.all([proc.next((m) => m === 'done'), workerDone]);
    await worker.terminate();
    await manager.dispose();
    assert.equal(log.length, 30);
    for (let i = 0; i < log.length; i += 2) {
      assert.equal(log[i][0], '+', `entry ${i} of ${log.join(' ')}`);
      assert.equal(log[i + 1], `-${log[i].slice(1)}`, `overlap at ${i}: ${log.join(' ')}`);
    }
  });

  it('a burst of aborted waits leaks no lock', async () => {
    const manager = new MutexManager({ redis: { url: redis.url }, namespace: 'burst', lockTTL: 2000 });
    const other = new MutexManager({ redis: { url: redis.url }, namespace: 'burst', lockTTL: 2000 });
    const holder = other.runOperation('b', () => sleep(100));
    await sleep(10);
    const controllers = Array.from({ length: 20 }, () => new AbortController());
    const waits = controllers.map((c) => manager.runOperation('b', () => 'ran', { signal: c.signal }));
    await sleep(20);
    controllers.forEach((c) => c.abort());
    const results = await Promise.allSettled(waits);
    assert.ok(results.every((r) => r.status === 'rejected' && r.reason instanceof MutexAbortedError));
    await holder;
    assert.equal(await manager.runOperation('b', () => 'free', { timeoutMs: 1000 }), 'free');
    assert.equal(redis.cli('KEYS', 'uniquemutex-v2:burst*'), '', 'no lock key left behind');
    await manager.dispose();
    await other.dispose();
  });

  it('strict mode fails a nested wait whose wait-for edge cannot be written; best-effort waits on', async () => {
    // This user may use the lock keys but not the wait-for metadata, so only the edge write fails.
    redis.cli('ACL', 'SETUSER', 'locks-only', 'on', '>locks-pw', '~uniquemutex*', '+@all');
    const url = redis.url.replace('redis://', 'redis://locks-only:locks-pw@');
    const { DistributedLockError } = await import('locco-rs/mutex');
    const opts = { redis: { url }, namespace: 'meta-denied', lockTTL: 2000 };
    const [m1, m2] = [new MutexManager(opts), new MutexManager(opts)];
    const lenient = new MutexManager({ ...opts, coordinationFailureMode: 'best-effort' });
    let release;
    const gate = new Promise((r) => (release = r));
    const holder = m2.runOperation('b', () => gate);
    await sleep(20);
    const strict = m1.runOperation('a', () => m1.runOperation('b', () => 'unexpected'));
    await assert.rejects(strict, (e) => e instanceof DistributedLockError && /wait-for metadata/.test(e.message));
    const waited = lenient.runOperation('c', () => lenient.runOperation('b', () => 'after b', { timeoutMs: 5000 }));
    await sleep(100);
    release();
    await holder;
    assert.equal(await waited, 'after b');
    await Promise.all([m1.dispose(), m2.dispose(), lenient.dispose()]);
  });

  it("a nested wait's coordination I/O is bounded by its timeout", async () => {
    const { MutexTimeoutError } = await import('locco-rs/mutex');
    const opts = { redis: { url: redis.url }, namespace: 'meta-hang', lockTTL: 2000 };
    const [m1, m2] = [new MutexManager(opts), new MutexManager(opts)];
    let release;
    const holder = m2.runOperation('b', () => new Promise((r) => (release = r)));
    await sleep(20);
    const started = Date.now();
    const waiting = m1.runOperation('a', async () => {
      try {
        return await m1.runOperation('b', () => 'unexpected', { timeoutMs: 600 });
      } catch (error) {
        return { error, after: Date.now() - started };
      }
    });
    await sleep(200); // the wait polls, publishing and reading edges
    redis.pause();
    let outcome;
    try {
      outcome = await waiting;
    } finally {
      redis.resume();
    }
    assert.ok(outcome.error instanceof MutexTimeoutError, String(outcome.error));
    assert.ok(outcome.after < 1500, `the wait ended ${outcome.after} ms in, with the server stopped`);
    release();
    await holder;
    await Promise.all([m1.dispose(), m2.dispose()]);
  });

  it('event-driven dependencies between ids do not read as deadlocks', async () => {
    const manager = new MutexManager({ redis: { url: redis.url }, namespace: 'events', lockTTL: 2000 });
    const { EventEmitter } = await import('node:events');
    const bus = new EventEmitter();
    const waiting = manager.runOperation('consumer', () => new Promise((r) => bus.once('ready', r)));
    const producing = manager.runOperation('producer', async () => {
      await sleep(10);
      bus.emit('ready', 'payload');
      return manager.runOperation('consumer', () => 'after the consumer', { timeoutMs: 2000 });
    });
    assert.equal(await waiting, 'payload');
    assert.equal(await producing, 'after the consumer');
    await manager.dispose();
  });
});
