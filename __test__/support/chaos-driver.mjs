// A model-based driver: from a seed it plans a history (callers, each with its own Locker
// and its own chaos adapter over one shared backend, running acquisitions, holds, extensions,
// releases and closes, while the clock sometimes jumps), runs it, and checks the rules a lock
// promises after every step. A history that breaks one answers its violations and a
// replayable log.

import { BackendError, LockHeldError, LockLostError, LockStateError, LoccoError, Locker } from 'locco-rs';
import { MutexManager } from 'locco-rs/mutex';
import { chaosAdapter, ChaosError } from 'locco-rs/testing';
import { InMemoryAdapter } from 'locco-rs/memory';
import { MapAdapter, QueuedMapAdapter } from './map-adapter.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const TIMED_OUT = Symbol('timed out');
/** How long an acquisition may take before it counts as never settling (its budget is < 2 s, but the run is busy). */
const SETTLE_MS = 20_000;
/** How long the driver waits for a release or a close before it moves on. */
const RELEASE_MS = 5_000;

/** A small seeded generator (mulberry32). */
export function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (n) => Math.floor(next() * n),
    chance: (p) => next() < p,
    pick: (list) => list[Math.floor(next() * list.length)],
  };
}

const PROFILES = [
  ['calm', {}],
  ['light', { fail: 0.03, late: 0.02, hang: 0.01, lostReply: 0.03, endSession: 0.005 }],
  ['heavy', { fail: 0.1, late: 0.04, hang: 0.02, lostReply: 0.08, endSession: 0.01 }],
  ['flaky', { fail: 0.25, lostReply: 0.1 }],
];
const TTLS = [60, 100, 150, 250, 400];
const SEMAPHORE = { key: 's', limit: 2 };
const RW = { key: 'rw', maxReaders: 3 };
const FAMILIES = {
  plain: ['acquire', 'tryAcquire', 'acquireMany', 'withLock'],
  permit: ['acquirePermit', 'acquirePermit', 'tryAcquirePermit'],
  rw: ['acquireRead', 'acquireRead', 'acquireWrite', 'acquireWrite', 'tryAcquireWrite'],
};

/** The plan of history `seed`: everything it does, drawn before it runs. */
export function plan(seed) {
  const r = rng(seed);
  if (r.chance(0.12)) return planMutex(seed, r);
  let [profile, rates] = r.pick(PROFILES);
  const family = r.pick(['plain', 'permit', 'rw', 'mixed', 'writer waits', 'writer waits', 'close while waiting']);
  const kinds = family === 'mixed' ? Object.values(FAMILIES).flat() : FAMILIES[family] ?? FAMILIES.rw;
  const op = (kind = r.pick(kinds), ttl = r.pick(TTLS)) => ({
    kind,
    ttl,
    autoExtend: r.chance(0.5),
    retry: r.chance(0.3) ? { timeout: 100 + r.int(500), delay: 10 + r.int(30) } : { retries: r.int(12), delay: 10 + r.int(30) },
    holdMs: r.int(Math.round(ttl * 1.3)),
    middle: r.pick(['none', 'none', 'extend', 'isHeld']),
    end: r.pick(['release', 'release', 'dispose']),
  });
  const callers = Array.from({ length: 2 + r.int(2) }, () => ({
    ops: Array.from({ length: 1 + r.int(2) }, () => op()),
    fencing: r.chance(0.3),
    closeAt: r.chance(0.35) ? r.int(400) : undefined,
  }));
  // Two shapes random plans seldom take, each a place where defects hide: a writer that waits
  // for a reader (its renewals while waiting, and after), and a caller whose Locker is closed
  // while its acquisition waits for another holder.
  if (family === 'writer waits') {
    // The writer comes once the reader is in, and only renewals fail: a writer gives up at
    // the first of its looks that fails, and a long wait is many looks.
    if (profile !== 'calm') [profile, rates] = ['renewals', { fail: 0.3, lostReply: 0.1 }];
    const ttl = 400;
    callers[0].ops = [{ ...op('acquireRead', ttl), holdMs: 140 + r.int(80) }];
    callers[1].ops = [{ ...op('acquireWrite', ttl), retry: { retries: 12, delay: 30 + r.int(40) }, holdMs: r.int(100) }];
    callers[1].startAt = 20 + r.int(15);
    callers[0].closeAt = callers[1].closeAt = undefined;
  } else if (family === 'close while waiting') {
    const kind = r.pick(['acquire', 'withLock', 'acquireMany', 'acquireWrite']);
    const holding = kind === 'acquireWrite' ? 'acquireWrite' : 'acquire';
    callers[0].ops = [{ ...op(holding, r.pick([250, 400])), autoExtend: true, holdMs: 150 + r.int(200) }];
    callers[1].ops = [{ ...op(kind), retry: { retries: 12, delay: 20 + r.int(30) } }];
    callers[0].closeAt = undefined;
    callers[1].closeAt = 20 + r.int(150);
  }
  const jumps = Array.from({ length: family === 'writer waits' ? 0 : r.int(3) }, () => ({ at: r.int(500), by: 10 + r.int(300) }));
  const backend = r.pick(['map', 'map', 'queued map', 'queued map', 'memory']);
  const methods = profile === 'renewals' ? ['extend'] : undefined;
  return { seed, kind: 'locker', profile, rates, methods, family, backend, queued: backend === 'queued map', callers, jumps };
}

function planMutex(seed, r) {
  const [profile, rates] = r.pick(PROFILES);
  const lockTTL = r.pick([100, 200, 400]);
  const managers = Array.from({ length: 2 + r.int(2) }, () => ({
    runs: Array.from({ length: 1 + r.int(3) }, () => ({ holdMs: r.int(lockTTL * 2), timeoutMs: 200 + r.int(800) })),
  }));
  return { seed, kind: 'mutex', profile, rates, queued: r.chance(0.5), lockTTL, managers };
}

/** The plan, one line per caller, for a failure report. */
export function describePlan(p, server) {
  const backend = p.backend ?? (p.queued ? 'queued map' : 'map');
  const only = p.methods ? ` on ${p.methods.join(', ')} only` : '';
  const head = server
    ? `seed ${p.seed}: ${p.kind} history on ${server}, real time, its connections killed`
    : `seed ${p.seed}: ${p.kind} history, faults ${p.profile} ${JSON.stringify(p.rates)}${only}, ${backend} backend`;
  if (p.kind === 'mutex') {
    return [head, `lockTTL ${p.lockTTL}`, ...p.managers.map((m, i) => `  manager m${i}: ${JSON.stringify(m.runs)}`)].join('\n');
  }
  return [
    head,
    `jumps ${JSON.stringify(p.jumps)}`,
    ...p.callers.map((c, i) => `  caller c${i} (fencing ${c.fencing}, start at ${c.startAt ?? 0} ms, close at ${c.closeAt ?? 'end'} ms): ${c.ops.map((o) => JSON.stringify(o)).join(' ')}`),
  ].join('\n');
}

/** A queued map backend whose release pushes reach every adapter wrapping it. */
class SharedQueuedMapAdapter extends QueuedMapAdapter {
  constructor(options) {
    super(options);
    this.watchers = [];
    this.wake = (waiter) => {
      for (const wake of this.watchers) wake(waiter);
    };
  }
  watchQueue(wake) {
    this.watchers.push(wake);
  }
}

/**
 * The JavaScript map backend of a history, on the history's clock, each caller through a
 * chaos adapter of its own (a session each). `holds` and `live` read its real state at once.
 */
export function mapBackend(h, { queued, seed, rates, methods, realTime = false, lateMs }) {
  const Backend = queued ? SharedQueuedMapAdapter : MapAdapter;
  const map = new Backend({ now: h.clock });
  // On real time (a MutexManager reads the process's clock) a late answer waits instead.
  const advance = realTime
    ? undefined
    : (ms) => {
        h.offset += ms;
        h.step(`clock +${ms} (a late answer)`);
      };
  return {
    map,
    adapterFor(i) {
      const adapter = chaosAdapter(map, { seed: seed * 16 + i, rates, methods, advance, now: h.clock, lateMs });
      h.adapters.push(adapter);
      return adapter;
    },
    holds(key, token) {
      const e = map.live(key);
      return e !== undefined && e.token === token;
    },
    live() {
      const out = [];
      for (const key of map.entries.keys()) {
        const e = map.live(key);
        if (e) out.push({ key, token: e.token });
      }
      return out;
    },
  };
}

/** Every key a history may use: its plain keys, and the slot keys of its semaphore and read-write lock. */
export const KEYS = ['k', 'j', 's:turn', 's:permit:0', 's:permit:1', 'rw:write', 'rw:read:0', 'rw:read:1', 'rw:read:2'];

/**
 * The in-memory backend on the history's clock, each caller through a chaos adapter of its
 * own. Its state is read through an operator's inspect, so only at the end.
 */
export function memoryBackend(h, { seed, rates, methods }) {
  const memory = new InMemoryAdapter({ now: h.clock });
  const advance = (ms) => {
    h.offset += ms;
    h.step(`clock +${ms} (a late answer)`);
  };
  return {
    adapterFor(i) {
      const adapter = chaosAdapter(memory, { seed: seed * 16 + i, rates, methods, advance, now: h.clock });
      h.adapters.push(adapter);
      return adapter;
    },
    holdsAsync: (key, token) => memory.isHeld({ key, token }),
    async heldAtEnd() {
      const look = new Locker({ adapter: memory, now: h.clock });
      const held = [];
      for (const key of KEYS) if ((await look.inspect(key)).held) held.push(key);
      return held;
    },
  };
}

/** Awaits `promise` for at most `ms` of real time. */
function bounded(promise, ms) {
  let timer;
  const out = Promise.race([promise, new Promise((r) => (timer = setTimeout(r, ms, TIMED_OUT)))]);
  return out.finally(() => clearTimeout(timer));
}

class History {
  constructor(p) {
    this.plan = p;
    this.t0 = performance.now();
    this.offset = 0;
    this.clock = () => performance.now() - this.t0 + this.offset;
    this.lines = [];
    this.violations = [];
    this.notes = [];
    this.holders = new Set(); // { lock, group, caller, givingUp }
    this.adapters = [];
    // On a real server a session's end reaches its holder a round trip late: an overlap counts
    // once it outlasts `grace` ms. Zero on the map backend, whose clock the holders share.
    this.grace = 0;
    this.suspects = new Map(); // overlap text -> first seen
  }

  /** A rule broken by an overlap of holders: at once, or once it has lasted `grace` ms. */
  overlap(rule, text) {
    if (this.grace === 0) return this.violation(rule, text);
    const seen = this.suspects.get(text);
    if (seen === undefined) this.suspects.set(text, performance.now());
    else if (performance.now() - seen >= this.grace) this.violation(rule, `${text} (for ${this.grace} ms)`);
  }

  step(text) {
    this.lines.push({ at: this.clock(), text });
  }

  violation(rule, text) {
    if (this.violations.some((v) => v.rule === rule && v.text === text)) return;
    this.violations.push({ rule, text, at: this.clock() });
    this.step(`VIOLATION ${rule}: ${text}`);
  }

  /** Every line: the driver's steps and each adapter's calls, in clock order. */
  report() {
    const calls = this.adapters.flatMap((a, i) => a.chaos.log.map((e) => ({ at: e.at, text: `  a${i} ${describeCall(e)}` })));
    const all = [...this.lines, ...calls].sort((x, y) => x.at - y.at);
    return all.map((l) => `${l.at.toFixed(1).padStart(8)} ${l.text}`).join('\n');
  }

  /** Whether the backend holds `key` for `token` now; undefined when it cannot be read at once. */
  holds(key, token) {
    return this.backend.holds?.(key, token);
  }

  /** The dropped lease of `lock`, when an ended session took it from the backend. */
  dropOf(lock) {
    const token = lock.token;
    for (const a of this.adapters) {
      const d = a.chaos.dropped.find((x) => x.token === token && x.key === lock.key);
      if (d) return d;
    }
    return undefined;
  }

  /**
   * The rules at this moment: every lock that reads held (and whose caller still uses it) is
   * on the backend under its token, unless an ended session dropped it less than a lease
   * ago; and, of those, never two on one key, more than `limit` permits or a writer beside
   * anyone.
   */
  check() {
    const counts = new Map();
    for (const h of this.holders) {
      if (h.givingUp) continue;
      const { lock } = h;
      if (lock.state !== 'held') continue;
      // A lease an ended session dropped: its holder must see the loss within the lease,
      // and it holds nothing meanwhile.
      const drop = this.dropOf(lock);
      if (drop !== undefined) {
        if (this.clock() > drop.at + lock.ttl) {
          this.violation('drop-unnoticed', `${h.caller}'s ${lock.key} was dropped at ${drop.at.toFixed(1)} and still reads held after its ttl ${lock.ttl}`);
        }
        continue;
      }
      if (this.holds(lock.key, lock.token) === false) {
        this.violation('held-but-not-on-backend', `${h.caller} reads ${lock.key} held (token ${lock.token}) but the backend does not hold it`);
        continue;
      }
      const g = counts.get(h.group.name) ?? { group: h.group, plain: 0, readers: 0, writers: 0, who: [] };
      if (h.group.role === 'read') g.readers++;
      else if (h.group.role === 'write') g.writers++;
      else g.plain++;
      g.who.push(`${h.caller}:${lock.key}`);
      counts.set(h.group.name, g);
    }
    for (const g of counts.values()) {
      const { group } = g;
      const who = g.who.join(', ');
      if (group.role === undefined && group.limit === undefined && g.plain > 1) this.overlap('two-holders', `${group.name}: ${who}`);
      if (group.limit !== undefined && g.plain > group.limit) this.overlap('over-limit', `${group.name} limit ${group.limit}: ${who}`);
      if (g.writers > 1 || (g.writers === 1 && g.readers > 0)) this.overlap('writer-not-alone', `${group.name}: ${who}`);
    }
  }
}

function describeCall(e) {
  const ttl = e.ttl === undefined ? '' : ` ttl=${e.ttl}`;
  const fault = e.fault === undefined ? '' : ` [${e.fault}]`;
  return `#${e.n} ${e.method} ${JSON.stringify(e.key)} token=${e.token ?? '-'}${ttl}${fault} -> ${e.outcome}`;
}

/** The group a holder counts in, and the keys an acquisition of `kind` asks for. */
function shape(kind) {
  switch (kind) {
    case 'acquirePermit':
    case 'tryAcquirePermit':
      return { group: { name: SEMAPHORE.key, limit: SEMAPHORE.limit }, asked: [SEMAPHORE.key] };
    case 'acquireRead':
      return { group: { name: RW.key, role: 'read' }, asked: [RW.key] };
    case 'acquireWrite':
    case 'tryAcquireWrite':
      return { group: { name: RW.key, role: 'write' }, asked: [RW.key] };
    case 'acquireMany':
      return { group: undefined, asked: ['j', 'k'] };
    default:
      return { group: { name: 'k' }, asked: ['k'] };
  }
}

/**
 * Judges what an operation rejected with: the adapter's own error passed through untouched,
 * or a documented class that fits the operation (`lostOk`: the keys a LockLostError may name).
 */
function judge(h, c, what, error, { asked: names = [], lostOk: lostNames = [] } = {}) {
  const asked = names.map((k) => h.prefix + k);
  const lostOk = lostNames.map((k) => (k.startsWith(h.prefix) ? k : h.prefix + k));
  const name = error instanceof Error ? `${error.constructor.name}: ${error.message}` : String(error);
  h.step(`${c.name} ${what} rejected: ${name}`);
  if (c.adapter.chaos?.threw(error)) return;
  if (error instanceof ChaosError) return h.violation('altered-adapter-error', `${c.name} ${what}: ${name} is not the object the adapter threw`);
  if (error instanceof LockHeldError) {
    // The key asked for, or one of its documented slot keys (a writer's `<key>:write`).
    const slot = asked.some((k) => error.key === `${k}:write` || new RegExp(`^${k}:(permit|read):\\d+$`).test(error.key));
    if (!asked.includes(error.key) && !slot) h.violation('error-names-another-key', `${c.name} ${what}: ${name} (key ${error.key})`);
    return;
  }
  if (error instanceof BackendError) return;
  if (error instanceof LockStateError) {
    if (!c.closeCalled && !what.includes('extend')) h.violation('state-error-without-close', `${c.name} ${what}: ${name}`);
    return;
  }
  if (error instanceof LockLostError) {
    if (!lostOk.includes(error.key)) h.violation('lost-error-from-acquisition', `${c.name} ${what}: ${name} (key ${error.key})`);
    return;
  }
  h.violation('undocumented-error', `${c.name} ${what}: ${name}`);
}

function describeOp(op) {
  const ax = op.autoExtend ? ', autoExtend' : '';
  return `${op.kind}(ttl ${op.ttl}${ax}, retry ${JSON.stringify(op.retry)})`;
}

function optionsOf(op) {
  const options = { ttl: op.ttl };
  if (op.autoExtend) options.autoExtend = { maxHold: 5000 };
  return options;
}

/** Starts the acquisition `op` answers: a Lock, a LockSet, or null. */
function start(locker, op) {
  const options = optionsOf(op);
  const withRetry = { ...options, retry: op.retry };
  switch (op.kind) {
    case 'acquire':
      return locker.acquire('k', withRetry);
    case 'tryAcquire':
      return locker.tryAcquire('k', options);
    case 'acquireMany':
      return locker.acquireMany(['k', 'j'], withRetry);
    case 'acquirePermit':
      return locker.acquirePermit(SEMAPHORE.key, { ...withRetry, limit: SEMAPHORE.limit });
    case 'tryAcquirePermit':
      return locker.tryAcquirePermit(SEMAPHORE.key, { ...options, limit: SEMAPHORE.limit });
    case 'acquireRead':
      return locker.acquireRead(RW.key, { ...withRetry, maxReaders: RW.maxReaders });
    case 'acquireWrite':
      return locker.acquireWrite(RW.key, { ...withRetry, maxReaders: RW.maxReaders });
    case 'tryAcquireWrite':
      return locker.tryAcquireWrite(RW.key, { ...options, maxReaders: RW.maxReaders });
    default:
      throw new Error(`unknown operation ${op.kind}`);
  }
}

/**
 * The leases caller `c` left on the backend after giving up on an acquisition: each must
 * have been given back (a release was sent with its token), or be a lock `c` still holds.
 */
async function checkGaveBack(h, c, what) {
  // Give-backs leave on the engine's next turn.
  await new Promise((r) => setImmediate(r));
  await sleep(1);
  const mine = new Set([...h.holders].filter((x) => x.caller === c.name && !x.givingUp).map((x) => x.lock.token));
  const released = releasedTokens(h);
  for (const { key, token } of await liveGrants(h)) {
    if (!token.startsWith(`${c.name}.`) || mine.has(token) || released.has(token)) continue;
    h.violation('left-held', `${c.name} gave up on ${what}, but ${key} is still held for its token ${token}, never given back`);
  }
}

/** The grants the chaos adapters saw that the backend still holds. */
async function liveGrants(h) {
  const seen = new Map();
  for (const a of h.adapters) for (const e of a.chaos.log) if (e.granted) seen.set(`${e.key} ${e.token}`, e);
  const out = [];
  for (const { key, token } of seen.values()) {
    const held = h.backend.holds?.(key, token) ?? (await h.backend.holdsAsync?.(key, token));
    if (held) out.push({ key, token });
  }
  return out;
}

function releasedTokens(h) {
  const out = new Set();
  for (const a of h.adapters) for (const e of a.chaos.log) if (e.method === 'release') out.add(e.token);
  return out;
}

/** Holds what an acquisition answered, then lets go as the plan says. */
async function hold(h, c, op, got) {
  const { group } = shape(op.kind);
  const locks = got.locks ?? [got];
  const entries = locks.map((lock) => {
    const g = group ?? { name: lock.key };
    const entry = { lock, group: g, caller: c.name, givingUp: false };
    h.holders.add(entry);
    c.entries.push(entry);
    return entry;
  });
  h.check();
  await sleep(op.holdMs / 2);
  h.check();
  const lock = locks[0];
  if (op.middle === 'extend') {
    h.step(`${c.name} extend ${lock.key} (${op.ttl})`);
    try {
      const r = await bounded(lock.extend(op.ttl), RELEASE_MS);
      h.step(`${c.name} extend ${lock.key}: ${r === TIMED_OUT ? 'no answer' : 'ok'}`);
    } catch (error) {
      judge(h, c, `extend ${lock.key}`, error, { lostOk: [lock.key] });
    }
  } else if (op.middle === 'isHeld') {
    try {
      const r = await bounded(lock.isHeld(), RELEASE_MS);
      h.step(`${c.name} isHeld ${lock.key}: ${r === TIMED_OUT ? 'no answer' : r}`);
    } catch (error) {
      judge(h, c, `isHeld ${lock.key}`, error);
    }
  }
  h.check();
  await sleep(op.holdMs / 2);
  h.check();
  for (const e of entries) e.givingUp = true;
  h.step(`${c.name} ${op.end} ${locks.map((l) => `${l.key}(${l.state})`).join(' ')}`);
  try {
    const r = await bounded(op.end === 'dispose' ? got[Symbol.asyncDispose]() : got.release(), RELEASE_MS);
    h.step(`${c.name} ${op.end}: ${r === TIMED_OUT ? 'no answer' : r}`);
  } catch (error) {
    judge(h, c, op.end, error);
  }
}

async function runWithLock(h, c, op) {
  const options = { ...optionsOf(op), retry: op.retry };
  let entry;
  const work = async (lock) => {
    if (c.closeDone) h.violation('granted-after-close', `${c.name} withLock ran its work after close() resolved`);
    h.step(`${c.name} withLock got ${lock.key} token ${lock.token}`);
    entry = { lock, group: { name: 'k' }, caller: c.name, givingUp: false };
    h.holders.add(entry);
    c.entries.push(entry);
    h.check();
    await sleep(op.holdMs);
    h.check();
    entry.givingUp = true;
    return 'done';
  };
  try {
    const r = await bounded(c.locker.withLock('k', options, work), SETTLE_MS);
    if (r === TIMED_OUT) stuck(h, c.adapter, `${c.name} withLock${entry?.givingUp ? ' (its work had finished)' : ''}`);
    else h.step(`${c.name} withLock answered ${r}`);
  } catch (error) {
    if (entry) entry.givingUp = true;
    judge(h, c, 'withLock', error, { asked: ['k'], lostOk: error?.completed === true ? ['k'] : [] });
  }
  await checkGaveBack(h, c, 'withLock');
}

/**
 * An operation that neither resolved nor rejected in SETTLE_MS. Told apart: one waiting on a
 * release the adapter never answered (a lease already lost is given back without a bound).
 */
function stuck(h, adapter, what) {
  const hung = adapter?.chaos?.log.find((e) => e.method === 'release' && e.fault === 'hang' && e.outcome === 'pending');
  if (hung) h.violation('stuck-on-hung-release', `${what} never settled; its adapter never answered ${describeCall(hung)}`);
  else h.violation('never-settled', `${what} neither resolved nor rejected in ${SETTLE_MS} ms`);
}

async function runOp(h, c, op) {
  if (op.kind === 'withLock') return runWithLock(h, c, op);
  const { asked } = shape(op.kind);
  h.step(`${c.name} ${describeOp(op)}`);
  let got;
  try {
    got = await bounded(start(c.locker, op), SETTLE_MS);
  } catch (error) {
    judge(h, c, op.kind, error, { asked, lostOk: op.kind === 'acquireMany' ? asked : [] });
    await checkGaveBack(h, c, op.kind);
    return;
  }
  if (got === TIMED_OUT) {
    stuck(h, c.adapter, `${c.name} ${describeOp(op)}`);
    return;
  }
  if (got === null) {
    h.step(`${c.name} ${op.kind}: null`);
    await checkGaveBack(h, c, op.kind);
    return;
  }
  const locks = got.locks ?? [got];
  h.step(`${c.name} ${op.kind} got ${locks.map((l) => `${l.key} token ${l.token} (${l.state})`).join(', ')}`);
  if (c.closeDone) {
    h.violation('granted-after-close', `${c.name} ${op.kind} answered ${locks.map((l) => `${l.key} (${l.state})`).join(', ')} after close() resolved`);
    for (const l of locks) await bounded(l.release().catch(() => {}), RELEASE_MS);
    return;
  }
  await hold(h, c, op, got);
}

async function closeCaller(h, c) {
  if (c.closeCalled) return c.closing;
  c.closeCalled = true;
  for (const e of c.entries) e.givingUp = true;
  h.step(`${c.name} close()`);
  c.closing = bounded(
    c.locker.close().then(
      () => {
        c.closeDone = true;
        h.step(`${c.name} close() resolved`);
        // On a real server a release that close() sent may fail (its connection killed): the
        // lock then truly still holds its lease until it runs out. Chaos adapters never fail
        // a close's release for long, so there a held lock is a lock close() forgot.
        for (const e of c.entries) {
          if (e.lock.state === 'held' && h.grace === 0) h.violation('held-after-close', `${c.name}'s ${e.lock.key} reads held after close() resolved`);
        }
      },
      (error) => judge(h, c, 'close', error),
    ),
    RELEASE_MS,
  ).then((r) => {
    if (r === TIMED_OUT) h.notes.push(`${c.name} close() did not settle in ${RELEASE_MS} ms`);
  });
  return c.closing;
}

/**
 * Runs history `p` (see `plan`) and answers its violations and log. By default on a map
 * backend on the history's own clock, through chaos adapters; `env.backend(h)` gives another
 * (a real server, on real time): `{ adapterFor(i), holds?, live?, heldAtEnd? }`, and
 * `env.prefix` keeps its keys apart from other histories'.
 */
export async function runHistory(p, env = {}) {
  if (p.kind === 'mutex') return runMutexHistory(p);
  const h = new History(p);
  const real = env.backend !== undefined;
  if (real) {
    h.clock = () => performance.now() - h.t0;
    h.grace = env.grace ?? 100;
  }
  h.prefix = env.prefix ?? '';
  h.backend = real ? await env.backend(h) : p.backend === 'memory' ? memoryBackend(h, p) : mapBackend(h, p);
  const callers = p.callers.map((cp, i) => {
    const name = `c${i}`;
    const adapter = h.backend.adapterFor(i);
    let n = 0;
    const c = { name, plan: cp, adapter, entries: [], closeCalled: false, closeDone: false, closing: undefined };
    c.locker = new Locker({
      adapter,
      now: real ? undefined : h.clock,
      keyPrefix: h.prefix,
      fencing: cp.fencing,
      token: () => `${name}.${++n}`,
      onEvent: (e) => {
        if (e.type === 'lost' || e.type === 'extendFailed' || e.type === 'releaseFailed') {
          h.step(`${name} event ${e.type} ${e.key}${e.reason ? ` (${e.reason})` : ''}`);
        }
      },
    });
    return c;
  });
  const timers = [];
  for (const j of real ? [] : p.jumps) {
    timers.push(
      setTimeout(() => {
        h.offset += j.by;
        h.step(`clock +${j.by} (a pause)`);
        h.check();
      }, j.at),
    );
  }
  for (const c of callers) {
    if (c.plan.closeAt !== undefined) timers.push(setTimeout(() => closeCaller(h, c), c.plan.closeAt));
  }
  const ticker = setInterval(() => h.check(), 5);
  try {
    await Promise.all(
      callers.map(async (c) => {
        if (c.plan.startAt !== undefined) await sleep(c.plan.startAt);
        for (const op of c.plan.ops) {
          if (c.closeCalled) break;
          await runOp(h, c, op);
          h.check();
        }
      }),
    );
    for (const t of timers) clearTimeout(t);
    await Promise.all(callers.map((c) => closeCaller(h, c)));
    h.check();
    await finish(h, callers.every((c) => c.closeDone));
  } finally {
    clearInterval(ticker);
    for (const t of timers) clearTimeout(t);
  }
  return { violations: h.violations, notes: h.notes, report: () => `${describePlan(p, env.name)}\n${h.report()}` };
}

/**
 * Once every caller has given up: nothing calls the backend to take or keep a key, every
 * lease still on it was given back (its release may have failed), and once the leases have
 * run out no key is held.
 */
async function finish(h, allClosed) {
  for (const a of h.adapters) a.chaos.quiet = true;
  const mark = h.adapters.map((a) => a.chaos.log.length);
  h.step('every caller has given up');
  // Longer than a heartbeat interval (a third of the ttl), for a renewal nobody should send.
  await sleep(160);
  if (allClosed) {
    h.adapters.forEach((a, i) => {
      for (const e of a.chaos.log.slice(mark[i])) {
        if (e.method !== 'release' && e.method !== 'leaveQueue') {
          h.violation('activity-after-close', `a${i} got ${describeCall(e)} after every Locker was closed`);
        }
      }
    });
  }
  const released = releasedTokens(h);
  for (const { key, token } of await liveGrants(h)) {
    if (!released.has(token)) h.violation('left-held', `${key} is held for ${token} after every caller gave up, never given back`);
  }
  if (h.grace > 0) {
    // Real time: a look at a key holds it for up to 2 s when its give-back failed; every ttl is shorter.
    await sleep(2200);
  } else {
    h.offset += 10_000;
    h.step('clock +10000 (every lease over)');
    await sleep(20);
  }
  if (h.backend.heldAtEnd !== undefined) {
    for (const key of await h.backend.heldAtEnd()) h.violation('held-after-the-end', `${key} is held after every lease ran out`);
  } else {
    for (const { key, token } of h.backend.live()) {
      h.violation('held-after-the-end', `${key} is held for ${token} after every lease ran out`);
    }
  }
  // What never answered fails now, so that no promise of the history stays pending.
  for (const a of h.adapters) a.chaos.settleHung();
}

/**
 * Managers on one backend (through their own chaos adapters) run operations on one id:
 * callbacks never overlap unless the earlier one's lease was dropped, and then its
 * abortSignal aborts within the lease; every rejection is a LoccoError or the adapter's own.
 */
async function runMutexHistory(p) {
  const h = new History(p);
  h.clock = () => performance.now() - h.t0;
  // MutexManager reads the process's clock: so does its backend, and a late answer waits.
  const backend = mapBackend(h, { ...p, realTime: true, lateMs: p.lockTTL });
  h.backend = backend;
  const active = new Set();
  const managers = p.managers.map((mp, i) => {
    const adapter = backend.adapterFor(i);
    return { name: `m${i}`, plan: mp, adapter, manager: new MutexManager({ adapter, lockTTL: p.lockTTL }) };
  });
  // A callback's lease, read on the clock as assertLock reads it (its abortSignal comes from
  // a timer, which a busy event loop runs late).
  const holding = (x) => {
    try {
      x.assertLock();
      return true;
    } catch {
      return false;
    }
  };
  const checkOverlap = () => {
    const live = [...active].filter(holding);
    for (const x of live) {
      const drop = x.m.adapter.chaos.dropped.find((d) => d.at >= x.since);
      if (drop && h.clock() > drop.at + p.lockTTL) {
        h.violation('drop-unnoticed', `${x.name}'s lease was dropped at ${drop.at.toFixed(1)} and assertLock still passes after lockTTL`);
      }
    }
    const undropped = live.filter((x) => !x.m.adapter.chaos.dropped.some((d) => d.at >= x.since));
    if (undropped.length > 1) h.violation('two-holders', `callbacks ${undropped.map((x) => x.name).join(', ')} run at once`);
  };
  const ticker = setInterval(checkOverlap, 5);
  try {
    await Promise.all(
      managers.map(async (m) => {
        for (const [j, run] of m.plan.runs.entries()) {
          const name = `${m.name}.${j}`;
          h.step(`${name} runOperation('m', hold ${run.holdMs}, timeoutMs ${run.timeoutMs})`);
          let ran = false;
          try {
            const r = await bounded(
              m.manager.runOperation(
                'm',
                async ({ assertLock }) => {
                  const x = { name, m, assertLock, since: h.clock() };
                  h.step(`${name} runs`);
                  active.add(x);
                  checkOverlap();
                  await sleep(run.holdMs);
                  checkOverlap();
                  active.delete(x);
                  ran = true;
                  return 'done';
                },
                { timeoutMs: run.timeoutMs },
              ),
              SETTLE_MS,
            );
            if (r === TIMED_OUT) stuck(h, m.adapter, `${name} runOperation${ran ? ' (its callback had finished)' : ''}`);
            else h.step(`${name} answered ${r}`);
          } catch (error) {
            const text = error instanceof Error ? `${error.constructor.name}: ${error.message}` : String(error);
            h.step(`${name} rejected: ${text}`);
            if (!(error instanceof LoccoError) && !m.adapter.chaos.threw(error)) h.violation('undocumented-error', `${name}: ${text}`);
          }
        }
      }),
    );
    for (const a of h.adapters) a.chaos.quiet = true;
    await sleep(30);
    const released = releasedTokens(h);
    for (const { key, token } of backend.live()) {
      if (!released.has(token)) h.violation('left-held', `${key} is held for ${token} after every operation settled, never given back`);
    }
    for (const a of h.adapters) a.chaos.settleHung();
  } finally {
    clearInterval(ticker);
  }
  return { violations: h.violations, notes: h.notes, report: () => `${describePlan(p)}\n${h.report()}` };
}
