'use strict';
// The one place that talks to the native binding: it registers the trampolines the engine
// calls, and turns the binding's answers (a value, PENDING, FAILED) into values and promises.

const native = require('./load.js');
const errors = require('./errors.js');
const { IdTable } = require('./id-table.js');

const PENDING = -1;
const FAILED = -2;

const waiting = new IdTable(); // opId -> { resolve, reject, map }
const early = new IdTable(); // opId -> [value, isError], settled before anyone waited
const foreign = new Map(); // id -> a value thrown by user code, kept while Rust refers to it
const lockers = new Map(); // lockerId -> { onEvent, token }
const clocks = new Map(); // clockId -> () => number
const adapters = new Map(); // adapterId -> a JavaScript adapter object
const delays = new Map(); // delayId -> DelayFn
const lossHandlers = new IdTable(); // lockId -> (reason, cause) => void
const jsAdapterIds = new WeakMap(); // a JavaScript adapter object -> its adapterId
let nextOp = 1;
let nextForeign = 1;
let nextClock = 1;
let nextAdapter = 1;

const ADAPTER_METHODS = ['acquire', 'release', 'extend', 'isHeld', 'acquireFenced'];
/** The optional queue methods of an adapter written in JavaScript: all three, or none. */
const QUEUE_METHODS = ['acquireQueued', 'leaveQueue', 'watchQueue'];
// Engine method numbers: 5 acquireQueued, 6 acquireQueued with fencing, 7 leaveQueue.
const QUEUE_METHODS_FROM = 5;

/**
 * Calls a queue method and checks its answer, passed to the engine as: true granted, a fence
 * granted, false waiting, -(retryIn + 1) waiting with a hint.
 */
async function queueCall(adapter, method, { key, token, ttl, waiter, lease }) {
  if (method === 7) {
    await adapter.leaveQueue({ key, waiter });
    return null;
  }
  const fenced = method === 6;
  const answer = await adapter.acquireQueued({ key, token, ttl, waiter, lease, fenced });
  const wrong = (what) => new TypeError(`acquireQueued of ${JSON.stringify(key)} answered ${what}: it answers { granted: true${fenced ? ', fence' : ''} } or { granted: false, retryIn? }`);
  if (answer === null || typeof answer !== 'object' || typeof answer.granted !== 'boolean') throw wrong('no { granted }');
  if (answer.granted) {
    if (!fenced) return true;
    if (!Number.isSafeInteger(answer.fence) || answer.fence < 1) throw wrong(`fence ${answer.fence}`);
    return answer.fence;
  }
  if (answer.retryIn === undefined) return false;
  if (!(Number.isFinite(answer.retryIn) && answer.retryIn >= 0)) throw wrong(`retryIn ${answer.retryIn}`);
  return -(answer.retryIn + 1);
}
const ABORTED = Symbol('aborted');

function makeError(d) {
  switch (d.code) {
    case 'LOCK_HELD':
      return new errors.LockHeldError(d.message, d);
    case 'LOCK_LOST':
      return new errors.LockLostError(d.message, d);
    case 'LOCK_STATE':
      return new errors.LockStateError(d.message);
    case 'LOCK_VALIDATION':
      return new errors.ValidationError(d.message, d);
    case 'LOCK_BACKEND':
      return new errors.BackendError(d.message, d);
    case 'LOCK_REDIS_REPLICATION':
      return new errors.RedisReplicationError(d.message, d);
    case 'FOREIGN':
      return foreign.get(d.foreignId);
    case 'ABORTED':
      return ABORTED;
    default:
      return new errors.LoccoError(d.message, d.code);
  }
}

/** Passes what user code threw (or answered wrongly) to the engine, untouched. */
function hostFail(opId, error) {
  const id = nextForeign++;
  foreign.set(id, error);
  if (!native.hostDone(opId, 3, id)) foreign.delete(id);
}

function hostAnswer(opId, value) {
  if (typeof value === 'boolean') native.hostDone(opId, 0, value ? 1 : 0);
  else if (value === null) native.hostDone(opId, 2, 0);
  else native.hostDone(opId, 1, typeof value === 'number' ? value : NaN);
}

function callHost(fn, arg, opId) {
  let out;
  try {
    out = fn(arg);
  } catch (error) {
    hostFail(opId, error);
    return;
  }
  if (out !== null && typeof out === 'object' && typeof out.then === 'function') {
    out.then(
      (value) => hostAnswer(opId, value),
      (error) => hostFail(opId, error),
    );
  } else {
    hostAnswer(opId, out);
  }
}

// User callbacks (onEvent, and the abort listeners of a lost lock's signal) never run while the
// engine is on the stack: one could call back into it mid-poll. They are queued and run as soon
// as the native call returns: at the next microtask, or sooner by `runLater` (a getter that
// must answer consistently with what the engine just said).
let queued = [];
function later(call) {
  if (queued.push(call) === 1) queueMicrotask(runLater);
}
function runLater() {
  while (queued.length > 0) {
    const calls = queued;
    queued = [];
    for (const [fn, ...args] of calls) fn(...args);
  }
}

// An awaited operation keeps the process alive, as a pending timer would; the library's own
// background work (heartbeats, expiry checks) does not.
// One interval, referenced only while something is awaited: toggling a reference is much
// cheaper than making and clearing a timer per operation.
let keepAlive;

/**
 * A promise of operation `opId`'s answer, or of `map(answer)`. `operation` and `key`, when
 * given, are named on a BackendError it fails with.
 */
function wait(opId, map, operation, key) {
  return withCallerFrames(settlement(opId, map, operation, key));
}

/**
 * `wait` without the caller's frames, for a release (every lock makes one; the acquisition's
 * own is `waitLock`): the extra await cost a fifth of the Redis throughput (W2).
 */
function waitHot(opId, map, operation, key) {
  return settlement(opId, map, operation, key);
}

/**
 * Awaits `promise` in an async function, so that an error it rejects with carries the async
 * frames of the code awaiting this one: an error made when the engine answers (in a libuv
 * callback) has none of the caller's frames otherwise.
 */
async function withCallerFrames(promise) {
  try {
    return await promise;
  } catch (error) {
    if (error instanceof Error) {
      const here = {};
      Error.captureStackTrace(here, withCallerFrames);
      error.stack = `${error.name}: ${error.message}${here.stack.slice(here.stack.indexOf('\n'))}`;
    }
    throw error;
  }
}

// The resolving functions of the promise `settlement` just made: caught by one executor for
// all, rather than by a closure made per operation.
let madeResolve;
let madeReject;
function capture(resolve, reject) {
  madeResolve = resolve;
  madeReject = reject;
}

function settlement(opId, map, operation, key) {
  const promise = new Promise(capture);
  track(opId, { resolve: madeResolve, reject: madeReject, map, operation, key });
  return promise;
}

/**
 * What a pending acquisition keeps while it waits: `hub.settle` maps the lock id with `map`
 * and names the key on an error, as it does with the closure other operations pass. One
 * object per waiting acquisition, where a closure, its context and the prefixed key were
 * three (every contended acquisition waits).
 */
class PendingLock {
  constructor(resolve, reject, locker, key, options) {
    this.resolve = resolve;
    this.reject = reject;
    this.locker = locker;
    this.name = key;
    this.options = options;
  }

  map(id) {
    return id === null ? null : this.locker._lock(id, this.name, this.options);
  }

  get operation() {
    return 'acquire';
  }

  get key() {
    return this.locker._prefix + this.name;
  }
}

/**
 * A promise of the Lock that acquisition `opId` of `key` on `locker` answers (or null),
 * without the caller's frames, as `waitHot`.
 */
function waitLock(opId, locker, key, options) {
  const promise = new Promise(capture);
  track(opId, new PendingLock(madeResolve, madeReject, locker, key, options));
  return promise;
}

/** Keeps `entry` until operation `opId` settles (at once when it already has). */
function track(opId, entry) {
  waiting.set(opId, entry);
  const settled = early.size === 0 ? undefined : early.get(opId);
  if (settled !== undefined) {
    early.delete(opId);
    hub.settle(opId, settled[0], settled[1]);
  } else if (waiting.size === 1) {
    keepAlive ??= setInterval(() => {}, 2 ** 30);
    keepAlive.ref();
  }
}

const hub = {
  settle(opId, value, isError) {
    const w = waiting.get(opId);
    if (w === undefined) {
      // Finished within the very call that answered PENDING; `wait` picks it up.
      early.set(opId, [value, isError]);
      return;
    }
    waiting.delete(opId);
    if (waiting.size === 0 && keepAlive !== undefined) keepAlive.unref();
    if (isError) w.reject(w.operation === undefined ? value : errors.nameOperation(value, w.operation, w.key));
    else if (w.map === undefined) w.resolve(value);
    else {
      try {
        w.resolve(w.map(value));
      } catch (error) {
        w.reject(error);
      }
    }
  },
  event(lockerId, type, key, ttl, a, b, reason, error) {
    const l = lockers.get(lockerId);
    if (l && l.onEvent) later([l.onEvent, type, key, ttl, a, b, reason, error]);
  },
  lost(lockId, reason, cause) {
    const handler = lossHandlers.get(lockId);
    if (handler !== undefined) later([handler, reason, cause]);
  },
  callAdapter(adapterId, method, key, token, ttl, waiter, lease, opId) {
    const adapter = adapters.get(adapterId);
    if (method >= QUEUE_METHODS_FROM) {
      callHost((x) => queueCall(adapter, method, x), { key, token, ttl, waiter, lease }, opId);
      return;
    }
    const name = ADAPTER_METHODS[method];
    const arg = ttl === undefined ? { key, token } : { key, token, ttl };
    callHost((x) => adapter[name](x), arg, opId);
  },
  callDelay(delayId, attempt, elapsedMs, previousDelay, opId) {
    callHost(delays.get(delayId), { attempt, elapsedMs, previousDelay }, opId);
  },
  now(clockId) {
    return clocks.get(clockId)();
  },
  token(lockerId) {
    return lockers.get(lockerId).token();
  },
  makeError,
  // process.emitWarning only queues the warning: nothing of the user's runs here.
  warn(code, text) {
    process.emitWarning(text, { code });
  },
  forgetError(id) {
    foreign.delete(id);
  },
  // The executor used up its turn (a storm of renewals): the rest runs after the event loop's
  // other work. Referenced, since an unreferenced immediate lets the loop sleep in its wait
  // for I/O first; it keeps a process alive only for as long as that work lasts.
  resume() {
    if (resumeQueued) return;
    resumeQueued = true;
    setImmediate(resumeEngine);
  },
};
let resumeQueued = false;
function resumeEngine() {
  resumeQueued = false;
  native.runPending();
}

// Numbers the fast calls hand back beside their answer (src/exports/fast.rs): slots 0-2 hold a
// forgotten lock's held time, fence and ttl (`fast.lockEnd`); from slot 3 on, a count and the
// (opId, value) pairs of operations that finished within a fast call, which `settleDeferred`
// settles when it returns.
const DEFERRED_AT = 3;
const DEFERRED_MAX = 32;
const endValues = new Float64Array(DEFERRED_AT + 1 + 2 * DEFERRED_MAX);

/**
 * Settles the operations that finished within the fast call that just returned. Copied out
 * first: a settle may run code that makes another fast call, which writes the slots anew.
 */
function settleDeferred() {
  const count = endValues[DEFERRED_AT];
  if (count === 0) return;
  if (count === 1) {
    const opId = endValues[DEFERRED_AT + 1];
    const value = endValues[DEFERRED_AT + 2];
    endValues[DEFERRED_AT] = 0;
    hub.settle(opId, value, false);
    return;
  }
  const pairs = endValues.slice(DEFERRED_AT + 1, DEFERRED_AT + 1 + 2 * count);
  endValues[DEFERRED_AT] = 0;
  for (let i = 0; i < pairs.length; i += 2) hub.settle(pairs[i], pairs[i + 1], false);
}
// The calls every lock makes, as raw functions (src/exports/fast.rs): acquireTtl, release, lockEnd.
// The first two may finish other operations (a release hands the key to a waiter): those are
// settled as each returns.
const rawFast = native.init(hub, () => {}, endValues);
const fast = {
  realm: rawFast.realm,
  lockEnd: rawFast.lockEnd,
  acquireTtl(lockerId, mode, key, ttl, opId) {
    try {
      return rawFast.acquireTtl(lockerId, mode, key, ttl, opId);
    } finally {
      settleDeferred();
    }
  },
  release(lockId, finalAttempt, opId) {
    try {
      return rawFast.release(lockId, finalAttempt, opId);
    } finally {
      settleDeferred();
    }
  },
};
// This load's ids start at realm * 2^40, so that a second load of the facade in the same
// environment (a cleared require cache) never takes this one's ids.
const idBase = fast.realm * 2 ** 40;
nextOp = nextForeign = nextClock = nextAdapter = idBase + 1;

// What the engine let go of (src/backends/js.rs `Kept`): the facade forgets its side of each.
const RELEASED_MAPS = [adapters, clocks, delays, lockers];
function drainReleased() {
  const pairs = native.takeReleased();
  for (let i = 0; i < pairs.length; i += 2) {
    const map = RELEASED_MAPS[pairs[i]];
    const id = pairs[i + 1];
    if (map === adapters) {
      const adapter = adapters.get(id);
      if (adapter !== undefined && jsAdapterIds.get(adapter) === id) jsAdapterIds.delete(adapter);
    }
    map.delete(id);
  }
}

// Native objects whose JavaScript owner (a Locker, a built-in adapter, a native backoff) was
// collected are dropped by the engine too; what they held is then released.
const DROP = { locker: 'dropLocker', adapter: 'dropAdapter', delay: 'dropDelay' };
const owners = new FinalizationRegistry(([kind, id]) => {
  native[DROP[kind]](id);
  drainReleased();
});

/** Frees native object `id` of `kind` ('locker' | 'adapter' | 'delay') once `owner` is collected. */
function own(owner, kind, id) {
  owners.register(owner, [kind, id], owner);
}

/**
 * The result of a native operation: the value itself when it finished within the call
 * (so the fast path makes no promise here), else a promise of `map(value)`.
 */
function answer(r, opId, map, operation, key, hot = false) {
  if (r === PENDING) return hot ? waitHot(opId, map, operation, key) : wait(opId, map, operation, key);
  if (r === FAILED) throw errors.nameOperation(native.takeError(fast.realm), operation, key);
  return r;
}

function nextOpId() {
  return nextOp++;
}

/** The id of a JavaScript adapter object, registered once while the engine uses it. */
function jsAdapterId(adapter) {
  let id = jsAdapterIds.get(adapter);
  if (id === undefined) {
    id = nextAdapter++;
    adapters.set(id, adapter);
    jsAdapterIds.set(adapter, id);
    // Once per adapter object: its pushes reach whichever Lockers use it then.
    if (typeof adapter.watchQueue === 'function') {
      adapter.watchQueue((waiter) => {
        if (typeof waiter === 'string') native.adapterWake(id, waiter);
      });
    }
  }
  return id;
}

/** A delay function's id, for the one retry policy it is passed in (the engine lets go of it after). */
function registerDelay(fn) {
  const id = native.createDelayFn();
  delays.set(id, fn);
  return id;
}

function registerClock(fn) {
  const id = nextClock++;
  clocks.set(id, fn);
  return id;
}

module.exports = {
  native,
  fast,
  endValues,
  answer,
  wait,
  waitLock,
  PENDING,
  nextOpId,
  registerClock,
  registerDelay,
  jsAdapterId,
  drainReleased,
  own,
  lockers,
  adapters,
  delays,
  lossHandlers,
  runLater,
  ABORTED,
  ADAPTER_METHODS,
  QUEUE_METHODS,
};
