'use strict';
// A lock adapter that misbehaves on purpose: it wraps any adapter (a built-in one or one
// written in JavaScript) and, drawing from a seed, makes some of its calls fail the ways a
// real backend does. Tests use it to check what a Locker promises when the backend is not
// well: no two holders, every loss seen, nothing left held, only documented errors.

const FAULTS = Object.freeze(['fail', 'late', 'hang', 'lostReply', 'endSession']);
const DEFAULT_RATES = Object.freeze({ fail: 0.03, late: 0.02, hang: 0.01, lostReply: 0.03, endSession: 0.005 });
const LEASE_METHODS = ['acquire', 'release', 'extend', 'isHeld', 'acquireFenced'];
const QUEUE_METHODS = ['acquireQueued', 'leaveQueue', 'watchQueue'];
const OPERATOR_METHODS = ['inspect', 'list', 'forceRelease'];
const CHAOS_OPTIONS = ['seed', 'rates', 'methods', 'advance', 'now', 'lateMs'];

/** What a chaos adapter throws. The Locker passes it through as is, as any adapter's error. */
class ChaosError extends Error {
  constructor(fault, method, key, applied) {
    const what = applied ? 'was applied, but its answer was lost' : 'failed';
    super(`chaos (${fault}): ${method} of ${JSON.stringify(key)} ${what}`);
    this.name = 'ChaosError';
    this.code = 'CHAOS';
    this.fault = fault;
    this.method = method;
    this.key = key;
    /** Whether the backend applied the call before the error (a lost reply). */
    this.applied = applied;
  }
}

/** 32-bit FNV-1a of a string: the seed of one call's draw. */
function hash(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** A number in [0, 1) from a 32-bit seed (one mulberry32 step). */
function uniform(seed) {
  let t = (seed + 0x6d2b79f5) | 0;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}

function checkRates(rates) {
  if (rates === null || typeof rates !== 'object') throw new TypeError('chaosAdapter: rates must be an object');
  let sum = 0;
  for (const [name, rate] of Object.entries(rates)) {
    if (!FAULTS.includes(name)) throw new TypeError(`chaosAdapter: unknown fault ${JSON.stringify(name)} in rates (faults: ${FAULTS.join(', ')})`);
    if (typeof rate !== 'number' || !(rate >= 0)) throw new TypeError(`chaosAdapter: rates.${name} must be a number >= 0`);
    sum += rate;
  }
  if (sum > 1) throw new TypeError(`chaosAdapter: the rates add up to ${sum}, more than 1`);
  return { ...rates };
}

/** Whether an inner answer means the backend granted the key to the caller's token. */
function granted(method, answer) {
  if (method === 'acquire') return answer === true;
  if (method === 'acquireFenced') return typeof answer === 'number';
  if (method === 'acquireQueued') return answer !== null && typeof answer === 'object' && answer.granted === true;
  return false;
}

function shown(value) {
  if (value === undefined) return 'undefined';
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  return JSON.stringify(value);
}

/**
 * Wraps `inner` in an adapter whose calls, drawn from `seed`, sometimes:
 * - `fail`: throw a ChaosError without reaching the backend;
 * - `late`: reach the backend, then answer after the caller's lease is over (the clock is
 *   moved by `advance(ms)` when given, else the answer waits that long);
 * - `hang`: never answer, and never reach the backend;
 * - `lostReply`: reach the backend, then throw (the change was made, the answer lost);
 * - `endSession`: drop every lease this adapter granted and still holds (its session ended),
 *   then throw.
 *
 * The draw for a call depends only on the seed, the method, the key and how many calls of
 * that method on that key came before it, so the same calls get the same faults.
 *
 * Options: `seed` (an integer, required); `rates`, the chance of each fault per call (default
 * DEFAULT_RATES); `methods`, the only methods whose calls are faulted (default all);
 * `advance(ms)`, which moves the clock the backend and its Lockers share; `now`, the clock of
 * the log (default performance.now); `lateMs`, how late the answer to a call without a ttl
 * comes (default 1000 ms).
 *
 * The adapter has the methods `inner` has, and a `chaos` property: `log` (every call, its
 * fault, its outcome and whether the backend granted the key), `dropped` (the leases an ended
 * session dropped), `quiet` (set it to stop injecting), `threw(error)` (whether this adapter
 * threw that error), `settleHung()` (the calls that never answered fail now) and `history()`.
 */
function chaosAdapter(inner, options) {
  if (inner === null || typeof inner !== 'object') throw new TypeError('chaosAdapter: pass the adapter to wrap');
  if (options === null || typeof options !== 'object') throw new TypeError('chaosAdapter: options must be an object { seed, rates? }');
  for (const name of Object.keys(options)) {
    if (!CHAOS_OPTIONS.includes(name)) throw new TypeError(`chaosAdapter: unknown option ${JSON.stringify(name)} (options: ${CHAOS_OPTIONS.join(', ')})`);
  }
  const { seed, advance, now = () => performance.now(), lateMs = 1000 } = options;
  if (!Number.isSafeInteger(seed)) throw new TypeError('chaosAdapter: seed must be an integer');
  if (advance !== undefined && typeof advance !== 'function') throw new TypeError('chaosAdapter: advance must be a function (ms) => void');
  if (typeof now !== 'function') throw new TypeError('chaosAdapter: now must be a function returning ms');
  const rates = checkRates(options.rates ?? DEFAULT_RATES);
  const { methods } = options;
  if (methods !== undefined && !(Array.isArray(methods) && methods.every((m) => typeof m === 'string'))) {
    throw new TypeError('chaosAdapter: methods must be an array of method names');
  }

  const log = [];
  const dropped = [];
  const thrown = new WeakSet();
  const counts = new Map(); // `${method} ${key}` -> calls so far
  const leases = new Map(); // key -> token: what this adapter granted and has not seen go
  const hung = new Set(); // [entry, reject] of the calls that never answered
  let next = 1;
  const state = {
    log,
    dropped,
    quiet: false,
    threw: (error) => error !== null && typeof error === 'object' && thrown.has(error),
    /** Ends the calls that never answered with a ChaosError, as a connection finally closed would. */
    settleHung() {
      const calls = [...hung];
      hung.clear();
      for (const [entry, reject] of calls) {
        const error = new ChaosError('hang', entry.method, entry.key, false);
        thrown.add(error);
        reject(error);
      }
    },
    history: () => log.map(describe).join('\n'),
  };

  function describe(e) {
    const ttl = e.ttl === undefined ? '' : ` ttl=${e.ttl}`;
    const fault = e.fault === undefined ? '' : ` [${e.fault}]`;
    return `#${e.n} t=${e.at.toFixed(1)} ${e.method} ${JSON.stringify(e.key)} token=${e.token ?? '-'}${ttl}${fault} -> ${e.outcome}`;
  }

  function draw(method, key) {
    if (state.quiet || (methods !== undefined && !methods.includes(method))) return undefined;
    const id = `${method} ${key}`;
    const k = counts.get(id) ?? 0;
    counts.set(id, k + 1);
    let u = uniform(hash(`${seed}|${id}|${k}`));
    for (const fault of FAULTS) {
      u -= rates[fault] ?? 0;
      if (u < 0) return fault;
    }
    return undefined;
  }

  function fail(entry, fault, applied) {
    const error = new ChaosError(fault, entry.method, entry.key, applied);
    thrown.add(error);
    throw error;
  }

  /** What an ended session leaves behind: nothing this adapter granted. */
  async function endSession() {
    const held = [...leases];
    leases.clear();
    for (const [key, token] of held) {
      // Listed before the release is sent: the backend may apply it before its answer comes,
      // and a reader then must see why the key is gone. Unlisted when the key stays.
      const drop = { key, token, at: now() };
      dropped.push(drop);
      let gone = false;
      try {
        gone = (await inner.release({ key, token })) === true;
      } catch {
        // The inner backend failed to drop it: the lease stays, as on a server that lived on.
      }
      if (!gone) dropped.splice(dropped.indexOf(drop), 1);
    }
  }

  function track(entry, method, input, answer) {
    if (granted(method, answer)) {
      entry.granted = true;
      leases.set(input.key, input.token);
    }
    else if (method === 'release' && answer === true && leases.get(input.key) === input.token) leases.delete(input.key);
  }

  async function call(method, input) {
    const key = input && input.key;
    const entry = {
      n: next++,
      at: now(),
      method,
      key,
      token: input && input.token,
      ttl: input && input.ttl,
      fault: undefined,
      granted: false,
      outcome: 'pending',
    };
    log.push(entry);
    const fault = draw(method, key);
    entry.fault = fault;
    try {
      if (fault === 'fail') fail(entry, fault, false);
      if (fault === 'hang') {
        return await new Promise((_, reject) => hung.add([entry, reject]));
      }
      if (fault === 'endSession') {
        await endSession();
        fail(entry, fault, false);
      }
      const answer = await inner[method](input);
      track(entry, method, input, answer);
      if (fault === 'lostReply') {
        entry.outcome = `applied ${shown(answer)}, then threw`;
        fail(entry, fault, true);
      }
      if (fault === 'late') {
        const by = (typeof input.ttl === 'number' ? input.ttl : lateMs) + 1;
        if (advance !== undefined) advance(by);
        else await new Promise((resolve) => setTimeout(resolve, by));
      }
      entry.outcome = shown(answer);
      return answer;
    } catch (error) {
      if (entry.outcome === 'pending') entry.outcome = `threw ${shown(error)}`;
      throw error;
    }
  }

  const adapter = { chaos: state };
  for (const method of LEASE_METHODS) {
    if (typeof inner[method] === 'function') adapter[method] = (input) => call(method, input);
  }
  if (QUEUE_METHODS.every((m) => typeof inner[m] === 'function')) {
    adapter.acquireQueued = (input) => call('acquireQueued', input);
    adapter.leaveQueue = (input) => call('leaveQueue', input);
    // Wake-ups are pushes, not calls: they pass through untouched.
    adapter.watchQueue = (wake) => inner.watchQueue(wake);
  }
  // Operator calls are for people and tests looking on: they pass through untouched.
  for (const method of OPERATOR_METHODS) {
    if (typeof inner[method] === 'function') adapter[method] = (input) => inner[method](input);
  }
  return adapter;
}

module.exports = { chaosAdapter, ChaosError, CHAOS_FAULTS: FAULTS, DEFAULT_CHAOS_RATES: DEFAULT_RATES };
