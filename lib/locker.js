'use strict';

const {
  native,
  fast,
  endValues,
  answer,
  waitLock,
  nextOpId,
  registerClock,
  registerDelay,
  drainReleased,
  own,
  lockers,
  lossHandlers,
  runLater,
  ABORTED,
  PENDING,
} = require('./native.js');
const { debuglog, inspect } = require('node:util');
const { LockHeldError, LockLostError, LockStateError, validation } = require('./errors.js');
const { refuseUnknown } = require('./options.js');
const { adapterRef } = require('./adapters.js');

const STATES = ['held', 'lost', 'released'];
const DEFAULT_RETRY = Object.freeze({ retries: 10, delay: 200, timeout: undefined, onBackendError: 'fail' });
const NATIVE_DELAY = Symbol('locco-rs.delayId');
const LOCKER_OPTIONS = ['adapter', 'retry', 'keyPrefix', 'onEvent', 'now', 'token', 'fencing'];
const RETRY_OPTIONS = ['retries', 'delay', 'timeout', 'onBackendError'];
const ACQUIRE_OPTIONS = ['ttl', 'retry', 'signal', 'autoExtend', 'holder'];
const TRY_ACQUIRE_OPTIONS = ['ttl', 'autoExtend', 'holder'];
const CLOSE_OPTIONS = ['release'];
const LIST_OPTIONS = ['prefix', 'limit'];
const DEFAULT_LIST_LIMIT = 1000;
// The longest a failed acquisition waits for a JavaScript adapter's inspect (the engine's bound).
const HOLDER_READ_MS = 250;
/** Read slots of a read-write lock unless `maxReaders` says otherwise: each is one look per writer. */
const DEFAULT_MAX_READERS = 32;
/** The holder label of the engine's looks at a key (slots.rs LOOK_HOLDER). */
const LOOK_HOLDER = 'locco:look';
/** The most permits or readers a key has (the engine's MAX_HOLDERS). */
const MAX_HOLDERS = 1024;

/** A count of slots: a whole number from 1 to MAX_HOLDERS, as the engine checks it. */
function slotCount(field, value) {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > MAX_HOLDERS) {
    throw validation(field, `must be a whole number from 1 to ${MAX_HOLDERS}, got ${value}`);
  }
  return value;
}
const AUTO_EXTEND_OPTIONS = ['interval', 'maxHold', 'maxEventLoopLag'];
const BACKOFF_OPTIONS = ['base', 'max', 'factor', 'jitter'];

// Locks the facade no longer refers to are forgotten by the engine too, in one call per batch.
// An object in a FinalizationRegistry survives the young-generation collections, which made
// registering every lock a sixth of the cost of a contended acquisition. So new locks wait in
// a small batch, and only those still unreleased when it is full (or on the next turn of the
// event loop) are registered; a cleanly released lock is forgotten by the engine at once
// (see `Lock._forget`), and unregistered if it was registered, so it can die young too.
let forgotten = [];
const forget = new FinalizationRegistry((id) => {
  if (forgotten.push(id) === 1) {
    queueMicrotask(() => {
      const ids = forgotten;
      forgotten = [];
      native.dropLocks(ids);
      drainReleased();
    });
  }
});

const RECENT_BATCH = 64;
let recentLocks = [];
let nextTurnCheck = false;
function registerUnreleased() {
  const locks = recentLocks;
  recentLocks = [];
  for (const lock of locks) {
    if (lock._end === undefined) {
      lock._registered = true;
      forget.register(lock, lock._id, lock);
    }
  }
}

function isObject(v) {
  return v !== null && typeof v === 'object';
}

function optionalNumber(field, v) {
  if (v !== undefined && typeof v !== 'number') throw validation(field, `must be a number, got ${typeof v}`);
  return v;
}

function optionalFunction(field, v) {
  if (v !== undefined && typeof v !== 'function') throw validation(field, `must be a function, got ${typeof v}`);
  return v;
}

/** The native id of a delay function: a native backoff's own, else one for this policy. */
function delayId(fn) {
  return fn[NATIVE_DELAY] ?? registerDelay(fn);
}

/** Checks a RetryOptions layer and answers the binding's view of it (src/exports/retry.rs RetrySpec). */
function retrySpec(field, retry) {
  if (retry === undefined) return undefined;
  if (!isObject(retry)) throw validation(field, 'must be an object { retries?, delay?, timeout?, onBackendError? }');
  refuseUnknown(field, retry, RETRY_OPTIONS);
  const retries = optionalNumber(`${field}.retries`, retry.retries);
  if (retries !== undefined && !(retries >= 0)) throw validation(`${field}.retries`, `must be >= 0, got ${retries}`);
  const { delay } = retry;
  let delayMs;
  let delayFn;
  if (typeof delay === 'function') delayFn = delayId(delay);
  else if (delay !== undefined && typeof delay !== 'number') {
    throw validation(`${field}.delay`, 'must be a number of ms or a function');
  } else if (delay !== undefined && !(delay >= 0)) {
    throw validation(`${field}.delay`, `must be >= 0, got ${delay}`);
  } else delayMs = delay;
  const { onBackendError } = retry;
  if (onBackendError !== undefined && onBackendError !== 'fail' && onBackendError !== 'retry') {
    throw validation(`${field}.onBackendError`, `must be 'fail' or 'retry', got ${JSON.stringify(onBackendError)}`);
  }
  return { retries, delayMs, delayId: delayFn, timeout: optionalNumber(`${field}.timeout`, retry.timeout), onBackendError };
}

/** Whether this process has emitted LOCCO_RETRIES_END_FIRST (it is emitted once). */
let warnedRetriesEndFirst = false;

/**
 * Warns once per process when a retry policy's retries run out long before its timeout: the
 * fields merge one by one, so `{ timeout: 10_000 }` alone keeps the default 10 retries 200 ms
 * apart and gives up after about 2 s. Only a number delay can be summed; a function is trusted.
 */
function warnIfRetriesEndFirst(policy) {
  const { retries, delay, timeout } = policy;
  if (warnedRetriesEndFirst || timeout === undefined || typeof delay !== 'number') return;
  if (retries === undefined || !Number.isFinite(retries) || retries * delay >= timeout) return;
  warnedRetriesEndFirst = true;
  process.emitWarning(
    `locco-rs: retry { retries: ${retries}, delay: ${delay} } waits at most about ${retries * delay} ms, so its timeout of ` +
      `${timeout} ms is never reached: the fields of a retry policy merge one by one, and retries left out keep ` +
      `their default (10). Set retries: Infinity to let the timeout alone bound the wait.`,
    { code: 'LOCCO_RETRIES_END_FIRST' },
  );
}

function mergeRetry(...layers) {
  const out = { ...DEFAULT_RETRY };
  for (const layer of layers) {
    if (!layer) continue;
    for (const k of RETRY_OPTIONS) if (layer[k] !== undefined) out[k] = layer[k];
  }
  return out;
}

function eventOf(type, key, ttl, a, b, reason, error) {
  switch (type) {
    case 'acquired':
      return { type, key, ttl, waitedMs: a, attempts: b };
    case 'contended':
      return { type, key, ttl, attempt: b, elapsedMs: a, reason };
    case 'backendRetry':
      return { type, key, ttl, attempt: b, elapsedMs: a, error };
    case 'lost':
      return error === undefined ? { type, key, ttl, heldMs: a, reason } : { type, key, ttl, heldMs: a, reason, error };
    case 'extendFailed':
    case 'releaseFailed':
      return { type, key, ttl, heldMs: a, error };
    default:
      return { type, key, ttl, heldMs: a };
  }
}

/**
 * `NODE_DEBUG=locco-rs`: one line per event of every Locker (acquired, contended, extended,
 * lost, released, and failures). Read once, when the module loads: off, a Locker asks the engine
 * for no events it was not asked for, so the hot path pays nothing.
 */
const debug = debuglog('locco-rs');
const debugLine = debug.enabled
  ? (e) => {
      const at = 'waitedMs' in e ? `waited ${e.waitedMs.toFixed(1)} ms, ${e.attempts} attempt(s)` : 'elapsedMs' in e ? `attempt ${e.attempt}, ${e.elapsedMs.toFixed(1)} ms in` : `held ${e.heldMs.toFixed(1)} ms`;
      const why = e.reason === undefined ? '' : ` (${e.reason})`;
      const error = e.error === undefined ? '' : `: ${e.error.message}`;
      debug('%s %j ttl %d ms, %s%s%s', e.type, e.key, e.ttl, at, why, error);
    }
  : undefined;

function lostError(key, reason, cause) {
  return new LockLostError(`lock ${JSON.stringify(key)} was lost (${reason})`, { key, reason, cause });
}

/** True for the common call `acquire('key', { ttl })`, which takes the short native path. */
function isTtlOnly(key, options) {
  if (typeof key !== 'string' || !isObject(options) || typeof options.ttl !== 'number') return false;
  // Anything else, a misspelt option included, goes the long way, which checks every name.
  for (const name in options) if (name !== 'ttl') return false;
  return true;
}

/** A held lease. Read `state`, `signal` or `lostReason` before a write that matters. */
class Lock {
  constructor(locker, id, key, callRetry) {
    this._locker = locker;
    this._id = id;
    this._callRetry = callRetry;
    this._controller = undefined;
    this._released = undefined;
    this._key = key;
    // Set once the engine has forgotten the lock: { token, heldMs, fence, ttl }.
    this._end = undefined;
    this._registered = false;
    if (recentLocks.push(this) === RECENT_BATCH) registerUnreleased();
    else if (!nextTurnCheck) {
      nextTurnCheck = true;
      setImmediate(() => {
        nextTurnCheck = false;
        registerUnreleased();
      });
    }
  }

  /** The key, prefix included. */
  get key() {
    return this._key;
  }

  get token() {
    return this._end === undefined ? native.lockToken(this._id) : this._end.token;
  }
  get fence() {
    return this._end === undefined ? (native.lockFence(this._id) ?? undefined) : this._end.fence;
  }
  get ttl() {
    return this._end === undefined ? native.lockTtl(this._id) : this._end.ttl;
  }
  /** The merged retry policy: built-in defaults, then the Locker's, then the call's. */
  get retry() {
    return mergeRetry(this._locker._retry, this._callRetry);
  }
  get state() {
    return this._end === undefined ? STATES[native.lockState(this._id)] : 'released';
  }
  get lostReason() {
    return this._end === undefined ? (native.lockLostReason(this._id) ?? undefined) : undefined;
  }
  get heldMs() {
    return this._end === undefined ? native.lockHeldMs(this._id) : this._end.heldMs;
  }

  /** Aborts, with a LockLostError as its reason, the moment the lease is known lost. */
  get signal() {
    if (this._controller === undefined) {
      const controller = new AbortController();
      this._controller = controller;
      const abort = (why, cause) => {
        lossHandlers.delete(this._id);
        if (!controller.signal.aborted) controller.abort(lostError(this.key, why, cause));
      };
      // Listening first: each read below runs the engine's pending work, which may lose the
      // lock (a backend reporting its session gone) between the reads.
      lossHandlers.set(this._id, abort);
      const reason = this.lostReason;
      if (reason !== undefined) abort(reason, native.lockLostCause(this._id));
      else if (this.state === 'held') native.lockWatch(this._id);
      else lossHandlers.delete(this._id);
    }
    // A loss the engine reported during an earlier getter is queued (see native.js `later`):
    // deliver it now, so the signal agrees with `state`.
    runLater();
    return this._controller.signal;
  }

  /** Deletes our key: true when it did, false when the key was gone or another holder's. */
  release() {
    return this._release(false);
  }

  _release(final) {
    if (this._end !== undefined) return Promise.resolve(false);
    try {
      const opId = nextOpId();
      const r = fast.release(this._id, final, opId);
      // Deleted and forgotten within the call: the answer is the token (see src/exports/fast.rs).
      if (typeof r === 'string') return Promise.resolve(this._afterRelease(true, r));
      const after = (deleted) => this._afterRelease(deleted);
      const a = answer(r, opId, after, 'release', this._key, true);
      return typeof a === 'boolean' ? Promise.resolve(this._afterRelease(a)) : a;
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** `token`: given when the engine has already forgotten the lock (its numbers in endValues). */
  _afterRelease(deleted, token) {
    if (this._released === undefined) this._released = deleted;
    // Most locks never had their signal read: no lookup for them.
    if (lossHandlers.size !== 0) lossHandlers.delete(this._id);
    if (this._end === undefined) this._forget(token);
    return deleted;
  }

  /** Once released, the lock's state is final: the engine forgets it and this object keeps it. */
  _forget(ended) {
    const token = ended ?? fast.lockEnd(this._id);
    if (token === null || token === undefined) return;
    const fence = endValues[1];
    this._end = { token, heldMs: endValues[0], fence: Number.isNaN(fence) ? undefined : fence, ttl: endValues[2] };
    if (this._registered) forget.unregister(this);
  }

  /** A new lease of `ttl` ms from now, clamped to the hold deadline. */
  extend(ttl) {
    try {
      if (typeof ttl !== 'number') throw validation('ttl', `must be a number of ms, got ${typeof ttl}`);
      if (this._end !== undefined) {
        throw new LockStateError(`lock ${JSON.stringify(this._key)} is released; it cannot be extended`);
      }
      const opId = nextOpId();
      return Promise.resolve(answer(native.extend(this._id, ttl, opId), opId, undefined, 'extend', this._key));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** One look at the backend. A false while held marks the lock lost ('observed'). */
  isHeld() {
    // Released: the key was deleted, or was never ours again.
    if (this._end !== undefined) return Promise.resolve(false);
    try {
      const opId = nextOpId();
      return Promise.resolve(answer(native.isHeld(this._id, opId), opId, undefined, 'isHeld', this._key));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  async [Symbol.asyncDispose]() {
    await this._release(true);
  }

  /** What a log line may show: never the token, which would let a reader release the lock. */
  toJSON() {
    const { key, state, ttl, heldMs, fence } = this;
    return fence === undefined ? { key, state, ttl, heldMs } : { key, state, ttl, heldMs, fence };
  }

  [inspect.custom](depth, options, inspectFn = inspect) {
    return `Lock ${inspectFn(this.toJSON(), options)}`;
  }
}

/** Several locks taken together by acquireMany. */
class LockSet {
  constructor(locks) {
    this.locks = locks;
    this._signal = undefined;
  }

  /** Aborts when any lock of the set is lost. */
  get signal() {
    this._signal ??= AbortSignal.any(this.locks.map((l) => l.signal));
    return this._signal;
  }

  /** Releases every lock; true when each deleted its key. Throws the first failure after trying all. */
  async release() {
    return this._releaseAll(false);
  }

  async _releaseAll(final) {
    const results = await Promise.allSettled(this.locks.map((l) => l._release(final)));
    const failed = results.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
    return results.every((r) => r.value === true);
  }

  /** Extends every lock to a new lease of `ttl` ms. */
  async extend(ttl) {
    await Promise.all(this.locks.map((l) => l.extend(ttl)));
  }

  async [Symbol.asyncDispose]() {
    await this._releaseAll(true);
  }
}

/** Acquires and holds leases on one backend. */
class Locker {
  constructor(options) {
    if (!isObject(options)) throw validation('options', 'must be an object with an adapter');
    refuseUnknown('', options, LOCKER_OPTIONS);
    drainReleased();
    const [adapter, jsFenced, jsQueued] = adapterRef(options.adapter);
    const keyPrefix = options.keyPrefix ?? '';
    if (typeof keyPrefix !== 'string') throw validation('keyPrefix', 'must be a string');
    const onEvent = optionalFunction('onEvent', options.onEvent);
    const now = optionalFunction('now', options.now);
    const token = optionalFunction('token', options.token);
    if (options.fencing !== undefined && typeof options.fencing !== 'boolean') {
      throw validation('fencing', 'must be a boolean');
    }
    const id = answer(
      native.createLocker({
        adapterId: adapter,
        jsFenced,
        jsQueued,
        keyPrefix,
        fencing: options.fencing === true,
        retry: retrySpec('retry', options.retry),
        events: onEvent !== undefined || debugLine !== undefined,
        clockId: now ? registerClock(now) : undefined,
        customToken: token !== undefined,
      }),
    );
    this._id = id;
    this._prefix = keyPrefix;
    // A JavaScript adapter answers the operator calls itself (see `inspect`).
    this._jsAdapter = jsFenced === undefined ? undefined : options.adapter;
    this._retry = options.retry;
    if (options.retry !== undefined) warnIfRetriesEndFirst(mergeRetry(options.retry));
    this._closed = undefined;
    own(this, 'locker', id);
    lockers.set(id, {
      token,
      onEvent:
        (onEvent !== undefined || debugLine !== undefined) &&
        ((...args) => {
          const event = eventOf(...args);
          debugLine?.(event);
          if (onEvent === undefined) return;
          try {
            onEvent(event);
          } catch {
            // What an event handler throws is dropped: it must not break locking.
          }
        }),
    });
  }

  /**
   * Releases every lock this Locker still holds (their heartbeats end with them) and frees
   * it: acquisitions still waiting, and any made afterwards, fail with LockStateError (a grant
   * that arrives after it is given back). With `{ release: false }` the held locks are not
   * released: their heartbeats stop and each lease runs out on the backend at its own end (a
   * claim left to expire). Calling it again is harmless; the first call decides.
   */
  close(options) {
    if (options !== undefined) {
      if (!isObject(options)) throw validation('options', 'must be an object { release? }');
      refuseUnknown('', options, CLOSE_OPTIONS);
      if (options.release !== undefined && typeof options.release !== 'boolean') {
        throw validation('release', `must be a boolean, got ${typeof options.release}`);
      }
    }
    if (this._closed === undefined) {
      try {
        const opId = nextOpId();
        const release = options?.release !== false;
        this._closed = Promise.resolve(answer(native.closeLocker(this._id, opId, release), opId)).then(() => {});
      } catch (error) {
        this._closed = Promise.reject(error);
      }
    }
    return this._closed;
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }

  /** Acquires `key`, retrying while another holder has it. */
  acquire(key, options) {
    const r = this._acquire(0, key, options, options && options.signal);
    return this._jsAdapter === undefined ? r : r.catch((e) => this._withHolder(e));
  }

  /**
   * A JavaScript adapter's LockHeldError gets the holder from its optional inspect (the
   * engine reads a built-in backend's itself): one call, after the acquisition failed.
   */
  async _withHolder(error) {
    const adapter = this._jsAdapter;
    if (!(error instanceof LockHeldError) || error.reason !== 'held' || typeof adapter.inspect !== 'function') throw error;
    let timer;
    try {
      // Bounded as the engine's own read is: a slow adapter leaves the holder unknown.
      const slow = new Promise((resolve) => {
        timer = setTimeout(resolve, HOLDER_READ_MS);
      });
      const info = await Promise.race([Promise.resolve().then(() => adapter.inspect({ key: error.key })), slow]);
      if (info && typeof info.holder === 'string' && info.held === true) {
        error.holder = info.holder;
        error.message = error.message.replace(' is held elsewhere:', ` is held by ${JSON.stringify(info.holder)}:`);
      }
    } catch {
      // Who holds it stays unknown; the contention is the answer.
    } finally {
      clearTimeout(timer);
    }
    throw error;
  }

  /** One attempt: the Lock, or null when another holder has the key. */
  tryAcquire(key, options) {
    return this._acquire(1, key, options, undefined);
  }

  _acquire(mode, key, options, signal) {
    try {
      let r;
      if (isTtlOnly(key, options)) {
        const opId = nextOpId();
        r = fast.acquireTtl(this._id, mode, key, options.ttl, opId);
        if (r === PENDING) return waitLock(opId, this, key, options);
        r = answer(r, opId, undefined, 'acquire', this._prefix + key);
      } else {
        if (typeof key !== 'string') throw validation('key', `must be a string, got ${typeof key}`);
        const spec = this._spec(options, mode === 1);
        const start = (abortId) => {
          const opId = nextOpId();
          spec.abortId = abortId;
          return answer(native.acquire(this._id, mode, key, spec, opId), opId, undefined, 'acquire', this._prefix + key);
        };
        r = signal === undefined ? start(undefined) : this._withSignal(signal, start);
      }
      if (typeof r === 'number') return Promise.resolve(this._lock(r, key, options));
      if (r === null) return Promise.resolve(null);
      return r.then((id) => (id === null ? null : this._lock(id, key, options)));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /**
   * A permit of the counting semaphore `key`: at most `options.limit` holders at once, each
   * with a lease of its own on one of `limit` slot keys (`<key>:permit:<i>`).
   */
  acquirePermit(key, options) {
    return this._holder(0, false, key, options);
  }

  /** One try for a permit: the Lock, or null when all `limit` permits are held. */
  tryAcquirePermit(key, options) {
    return this._holder(0, true, key, options);
  }

  /** A read of the read-write lock `key`: readers share it, a writer waits for them to leave. */
  acquireRead(key, options) {
    return this._holder(1, false, key, options);
  }

  /** One try for a read: the Lock, or null when a writer holds or waits for `key`. */
  tryAcquireRead(key, options) {
    return this._holder(1, true, key, options);
  }

  /** The write of the read-write lock `key`: alone, once the readers have left. */
  acquireWrite(key, options) {
    return this._holder(2, false, key, options);
  }

  /** One try for the write: the Lock, or null when a reader or writer holds `key`. */
  tryAcquireWrite(key, options) {
    return this._holder(2, true, key, options);
  }

  /** kind 0 a permit (count = limit), 1 a read, 2 the write (count = maxReaders). */
  _holder(kind, once, key, options) {
    try {
      if (typeof key !== 'string') throw validation('key', `must be a string, got ${typeof key}`);
      if (!isObject(options)) throw validation('options', 'must be an object with a ttl');
      const field = kind === 0 ? 'limit' : 'maxReaders';
      const { [field]: count = kind === 0 ? undefined : DEFAULT_MAX_READERS, ...rest } = options;
      if (count === undefined) throw validation('limit', 'is required: how many holders the semaphore admits at once');
      if (typeof count !== 'number') throw validation(field, `must be a number, got ${typeof count}`);
      const spec = this._spec(rest, once);
      const start = (abortId) => {
        const opId = nextOpId();
        spec.abortId = abortId;
        return answer(native.acquireHolder(this._id, kind, count, once, key, spec, opId), opId, undefined, 'acquire', this._prefix + key);
      };
      const r = rest.signal === undefined ? start(undefined) : this._withSignal(rest.signal, start);
      return Promise.resolve(r).then((id) => (id === null ? null : this._lock(id, undefined, options)));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Runs a native acquisition that `signal` can stop; rejects with signal.reason at once. */
  _withSignal(signal, start) {
    if (!(signal instanceof AbortSignal)) throw validation('signal', 'must be an AbortSignal');
    if (signal.aborted) return Promise.reject(signal.reason);
    const abortId = native.createAbort();
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        native.abort(abortId);
        reject(signal.reason);
      };
      const done = () => {
        signal.removeEventListener('abort', onAbort);
        native.dropAbort(abortId);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      let r;
      try {
        r = start(abortId);
      } catch (error) {
        done();
        reject(error);
        return;
      }
      Promise.resolve(r).then(
        (v) => {
          done();
          if (!signal.aborted) return resolve(v);
          // Granted before the engine heard of the abort, but the caller has already been
          // told "aborted": nobody will ever hold this lock, so give it back now.
          for (const id of Array.isArray(v) ? v : [v]) {
            const opId = nextOpId();
            const forget = () => native.dropLocks([id]);
            Promise.resolve(answer(fast.release(id, true, opId), opId)).then(forget, forget);
          }
        },
        (e) => {
          done();
          reject(e === ABORTED ? signal.reason : e);
        },
      );
    });
  }

  /** Checks one acquisition's options; answers the binding's view of them (src/exports/locker.rs AcquireSpec). */
  _spec(options, single) {
    if (!isObject(options)) throw validation('options', 'must be an object with a ttl');
    if (options.ttl === undefined) throw validation('ttl', 'is required (lease length in ms)');
    const ttl = optionalNumber('ttl', options.ttl);
    if (single && (options.retry !== undefined || options.signal !== undefined)) {
      throw validation('options', 'tryAcquire makes one attempt: retry and signal do not apply');
    }
    refuseUnknown('', options, single ? TRY_ACQUIRE_OPTIONS : ACQUIRE_OPTIONS);
    const retry = retrySpec('retry', options.retry);
    if (retry !== undefined) warnIfRetriesEndFirst(mergeRetry(this._retry, options.retry));
    const ax = options.autoExtend;
    if (ax !== undefined && !isObject(ax)) throw validation('autoExtend', 'must be an object { interval?, maxHold }');
    if (ax !== undefined) refuseUnknown('autoExtend', ax, AUTO_EXTEND_OPTIONS);
    const autoExtend = ax && {
      interval: optionalNumber('autoExtend.interval', ax.interval),
      maxHold: optionalNumber('autoExtend.maxHold', ax.maxHold),
      maxEventLoopLag: optionalNumber('autoExtend.maxEventLoopLag', ax.maxEventLoopLag),
    };
    const { holder } = options;
    if (holder !== undefined && typeof holder !== 'string') {
      throw validation('holder', `must be a string (a label such as a host name and pid), got ${typeof holder}`);
    }
    return { ttl, retry, autoExtend, abortId: undefined, holder };
  }

  _lock(id, key, options) {
    const fullKey = key === undefined ? native.lockKey(id) : this._prefix + key;
    return new Lock(this, id, fullKey, options.retry);
  }

  /**
   * Acquires `key`, runs `fn(lock)`, releases. Outcome order: fn's error; else LockLostError
   * (completed: true, with the result) when the lock was lost; else fn's value.
   */
  async withLock(key, options, fn) {
    if (typeof fn !== 'function') throw validation('fn', 'must be a function (lock) => result');
    const lock = await this.acquire(key, options);
    let result;
    try {
      result = await fn(lock);
    } catch (error) {
      await lock._release(true).catch(() => {}); // reported as a releaseFailed event
      throw error;
    }
    let deleted = lock._released;
    if (deleted === undefined) {
      try {
        deleted = await lock._release(true);
      } catch {
        // The work finished under a held lock; the failure went to releaseFailed.
        deleted = true;
      }
    }
    const reason = lock.lostReason;
    if (reason !== undefined || !deleted) {
      const why = reason ?? 'release';
      const cause = native.lockLostCause(lock._id);
      throw new LockLostError(
        `lock ${JSON.stringify(lock.key)} was lost (${why}) before the work finished`,
        { key: lock.key, reason: why, cause, completed: true, result },
      );
    }
    return result;
  }

  /**
   * What the backend knows of `key` now: `{ held, ttlLeft?, fence?, holder? }` (ms left of
   * the lease, the key's last fencing token, the holder's label). Never the token.
   */
  inspect(key) {
    try {
      checkKey(key);
      const adapter = this._jsAdapter;
      if (adapter !== undefined) {
        const call = jsOperatorCall(adapter, 'inspect', '{ key }', '{ held, ttlLeft?, fence?, holder? }');
        return call({ key: this._prefix + key }).then((r) => withoutKey(keyInfo(r, 'inspect')));
      }
      const opId = nextOpId();
      const r = answer(native.inspectKey(this._id, key, opId), opId, undefined, 'inspect', this._prefix + key);
      return Promise.resolve(r).then(withoutKey);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /**
   * Who holds the counting semaphore `key` of `options.limit` permits:
   * `{ limit, held, holders }`, each holder its permit's key and what inspect tells of it.
   * One inspect per permit, a few at a time (the backend keeps no count of its own).
   */
  async inspectPermits(key, options) {
    checkKey(key);
    if (!isObject(options)) throw validation('options', 'must be an object { limit }');
    refuseUnknown('', options, ['limit']);
    if (options.limit === undefined) throw validation('limit', 'is required: how many permits the semaphore has');
    const limit = slotCount('limit', options.limit);
    const holders = await this._heldOf(Array.from({ length: limit }, (_, i) => `${key}:permit:${i}`));
    return { limit, held: holders.length, holders };
  }

  /**
   * Who holds the read-write lock `key`: `{ maxReaders, writer, readers }`; `writer` (or null)
   * holds the write key, alone or waiting for the readers to leave.
   */
  async inspectReadWrite(key, options = {}) {
    checkKey(key);
    if (!isObject(options)) throw validation('options', 'must be an object { maxReaders? }');
    refuseUnknown('', options, ['maxReaders']);
    const maxReaders = slotCount('maxReaders', options.maxReaders ?? DEFAULT_MAX_READERS);
    const [writer = null] = await this._heldOf([`${key}:write`]);
    const readers = await this._heldOf(Array.from({ length: maxReaders }, (_, i) => `${key}:read:${i}`));
    return { maxReaders, writer, readers };
  }

  /**
   * The held keys of `keys`, each as `{ key, ...inspect }`, asked 16 at a time. A look (a
   * reader's instant at the write key, a writer's at a read slot) is no holder.
   */
  async _heldOf(keys) {
    const held = [];
    for (let i = 0; i < keys.length; i += 16) {
      const infos = await Promise.all(keys.slice(i, i + 16).map((k) => this.inspect(k)));
      infos.forEach((info, j) => info.held && info.holder !== LOOK_HOLDER && held.push({ key: keys[i + j], ...info }));
    }
    return held;
  }

  /**
   * The held keys starting with `prefix` (after the Locker's keyPrefix), at most `limit`
   * (default 1000): `[{ key, held: true, ttlLeft?, fence?, holder? }]`, keys without the
   * Locker's keyPrefix, so they can be passed back to inspect or forceRelease.
   */
  list(options = {}) {
    try {
      if (!isObject(options)) throw validation('options', 'must be an object { prefix?, limit? }');
      refuseUnknown('', options, LIST_OPTIONS);
      const prefix = options.prefix ?? '';
      if (typeof prefix !== 'string') throw validation('prefix', `must be a string, got ${typeof prefix}`);
      const limit = optionalNumber('limit', options.limit) ?? DEFAULT_LIST_LIMIT;
      const adapter = this._jsAdapter;
      if (adapter !== undefined) {
        const call = jsOperatorCall(adapter, 'list', '{ prefix, limit }', 'an array of { key, held, ttlLeft?, fence?, holder? }');
        const own = this._prefix;
        return call({ prefix: own + prefix, limit }).then((found) => {
          if (!Array.isArray(found)) throw validation('adapter', 'list must answer an array');
          return found
            .map((r) => keyInfo(r, 'list'))
            .filter((r) => r.held && r.key.startsWith(own))
            .map((r) => ({ ...r, key: r.key.slice(own.length) }))
            .slice(0, limit);
        });
      }
      const opId = nextOpId();
      return Promise.resolve(answer(native.listKeys(this._id, prefix, limit, opId), opId, undefined, 'list', this._prefix + prefix));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /**
   * Deletes whatever lease holds `key`, whatever its token; true when a live lease was
   * removed. An operator's tool, and a dangerous one: the holder is not told (it learns at
   * its next extend or isHeld, or when its heartbeat fails) and may still be writing, so only
   * fencing tokens checked by the resource keep its late writes out.
   */
  forceRelease(key) {
    try {
      checkKey(key);
      const adapter = this._jsAdapter;
      if (adapter !== undefined) {
        const call = jsOperatorCall(adapter, 'forceRelease', '{ key }', 'a boolean');
        return call({ key: this._prefix + key }).then((r) => {
          if (typeof r !== 'boolean') throw validation('adapter', `forceRelease must answer a boolean, got ${typeof r}`);
          return r;
        });
      }
      const opId = nextOpId();
      return Promise.resolve(answer(native.forceRelease(this._id, key, opId), opId, undefined, 'forceRelease', this._prefix + key));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Acquires a set of keys in sorted order; one timeout budget, retries per key. */
  acquireMany(keys, options) {
    try {
      if (!Array.isArray(keys) || keys.some((k) => typeof k !== 'string')) {
        throw validation('keys', 'must be an array of strings');
      }
      const signal = options && options.signal;
      const spec = this._spec(options, false);
      const start = (abortId) => {
        const opId = nextOpId();
        spec.abortId = abortId;
        return answer(native.acquire(this._id, 2, keys, spec, opId), opId);
      };
      const run = signal !== undefined ? this._withSignal(signal, start) : Promise.resolve().then(() => start(undefined));
      const set = run.then((ids) => new LockSet(ids.map((id) => this._lock(id, undefined, options))));
      return this._jsAdapter === undefined ? set : set.catch((e) => this._withHolder(e));
    } catch (error) {
      return Promise.reject(error);
    }
  }
}

function checkKey(key) {
  if (typeof key !== 'string') throw validation('key', `must be a string, got ${typeof key}`);
  if (key === '') throw validation('key', 'must be a non-empty string');
}

/** The optional operator method `name` of a JavaScript adapter, or a clear refusal naming it. */
function jsOperatorCall(adapter, name, input, output) {
  if (typeof adapter[name] !== 'function') {
    throw validation(
      'adapter',
      `this adapter has no ${name} method: add ${name}(${input}) answering ${output} to use locker.${name}`,
    );
  }
  return (arg) => Promise.resolve().then(() => adapter[name](arg));
}

/** A JavaScript adapter's answer about one key, checked, with only the documented fields. */
function keyInfo(r, method) {
  if (!isObject(r) || typeof r.held !== 'boolean') {
    throw validation('adapter', `${method} must answer { held: boolean, ttlLeft?, fence?, holder? }`);
  }
  const out = { key: typeof r.key === 'string' ? r.key : '', held: r.held };
  if (typeof r.ttlLeft === 'number') out.ttlLeft = r.ttlLeft;
  if (typeof r.fence === 'number') out.fence = r.fence;
  if (typeof r.holder === 'string') out.holder = r.holder;
  return out;
}

function withoutKey(info) {
  const { key: _key, ...rest } = info;
  return rest;
}

/**
 * Exponential backoff for `retry.delay`: base * factor^(attempt-1), capped at max. With
 * jitter (the default) each wait is drawn from the upper half of that value.
 */
function exponentialBackoff(options) {
  if (!isObject(options)) throw validation('options', 'must be an object { base, max, factor?, jitter? }');
  refuseUnknown('', options, BACKOFF_OPTIONS);
  const { base, max, factor = 2, jitter = true } = options;
  for (const [field, v] of [['base', base], ['max', max], ['factor', factor]]) {
    if (typeof v !== 'number') throw validation(field, `must be a number, got ${typeof v}`);
  }
  if (typeof jitter !== 'boolean') throw validation('jitter', 'must be a boolean');
  const id = answer(native.createBackoff(base, max, factor, jitter));
  const fn = ({ attempt }) => native.backoffDelay(id, attempt);
  Object.defineProperty(fn, NATIVE_DELAY, { value: id });
  own(fn, 'delay', id);
  return fn;
}

module.exports = { Locker, Lock, LockSet, exponentialBackoff };
