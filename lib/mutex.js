'use strict';
// locco-rs/mutex: per-id FIFO mutexes in one process, re-entrant per async call chain, with
// deadlock detection before any wait; distributed across processes through any locco-rs
// adapter when one is given.

const { AsyncLocalStorage } = require('node:async_hooks');
const { randomBytes, randomUUID } = require('node:crypto');
const { LoccoError, validation } = require('./errors.js');
const { refuseUnknown } = require('./options.js');
const { Locker } = require('./locker.js');
const { NATIVE_ID } = require('./adapters.js');
const { native, answer, nextOpId } = require('./native.js');

const [PEEK, PUT, GET, DELETE] = [0, 1, 2, 3];
const EDGE_PREFIX = 'locco-meta:wait:';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class MutexTimeoutError extends LoccoError {
  constructor(id, timeoutMs) {
    super(`mutex ${JSON.stringify(id)} was not acquired within ${timeoutMs} ms`, 'MUTEX_TIMEOUT');
    this.id = id;
    this.timeoutMs = timeoutMs;
  }
}

class MutexAbortedError extends LoccoError {
  constructor(id, reason) {
    super(`operation on mutex ${JSON.stringify(id)} was aborted`, 'MUTEX_ABORTED', { cause: reason });
    this.id = id;
    this.reason = reason;
  }
}

class MutexDeadlockError extends LoccoError {
  constructor(requestedId, cycle) {
    super(`waiting for mutex ${JSON.stringify(requestedId)} would deadlock: ${cycle.join(' -> ')}`, 'MUTEX_DEADLOCK');
    this.requestedId = requestedId;
    this.cycle = cycle;
  }
}

class DistributedLockError extends LoccoError {
  constructor(message, cause) {
    super(message, 'MUTEX_DISTRIBUTED', cause === undefined ? undefined : { cause });
  }
}

class LockExtensionError extends LoccoError {
  constructor(id, cause) {
    super(`the lease of mutex ${JSON.stringify(id)} was lost`, 'MUTEX_LOCK_EXTENSION', { cause });
    this.id = id;
  }
}

/** Kept for source compatibility: waitIfLocked: false now resolves undefined instead. */
class MutexLockedError extends LoccoError {
  constructor(id) {
    super(`mutex ${JSON.stringify(id)} is locked`, 'MUTEX_LOCKED');
    this.id = id;
  }
}

/** A logical call chain: what it holds, with re-entry counts. */
class MutexRunContext {
  constructor() {
    this._id = undefined;
    /** @type {Map<string, number>} */
    this.held = new Map();
  }

  /** Made on first use: a local manager makes a context per call and never needs it. */
  get id() {
    this._id ??= randomUUID();
    return this._id;
  }
}

/**
 * One ownership of a mutex: made when an operation takes it, gone when it lets go. Wait edges
 * name the holds their chain had when the wait began (its ownership generation), so a hold
 * taken or given back later, by another branch sharing the context, never joins a cycle.
 */
class Hold {
  constructor(id, context) {
    this.id = id;
    this.context = context;
    /** @type {string | undefined} the distributed lock's token, on a distributed manager */
    this.token = undefined;
    /** the distributed lock itself: a re-entry asserts it */
    this.lock = undefined;
  }
}

/** Shared by every chain that holds nothing; never written to. */
const NO_HOLDS = [];

/**
 * Where an operation runs: its context and the holds of its call chain (its own and those of
 * the operations it is nested in).
 */
class Frame {
  constructor(context, holds) {
    this.context = context;
    /** @type {Hold[]} */
    this.holds = holds;
  }
}

/**
 * The current frame without AsyncLocalStorage, as on runtimes that lack it: only while an
 * operation's callback runs synchronously. Across an async hop, pass `context` by hand.
 */
class StackTracker {
  constructor() {
    this._stack = [];
  }
  getStore() {
    return this._stack[this._stack.length - 1];
  }
  run(frame, fn) {
    this._stack.push(frame);
    try {
      return fn();
    } finally {
      this._stack.pop();
    }
  }
}

/** The chain a distributed lock token belongs to: tokens are `<chain id>.<random>`. */
function chainOf(token) {
  const dot = token.lastIndexOf('.');
  return dot === -1 ? undefined : token.slice(0, dot);
}

function checkOptions(options = {}) {
  if (options === null || typeof options !== 'object') throw validation('options', 'must be an object');
  refuseUnknown('', options, [
    'adapter',
    'redis',
    'namespace',
    'lockTTL',
    'lockExtendInterval',
    'coordinationFailureMode',
    'asyncContextTracking',
  ]);
  if (options.adapter !== undefined && options.redis !== undefined) {
    throw validation('redis', 'cannot be given with adapter: pass one of them (redis makes the manager its own RedisAdapter)');
  }
  if (options.redis !== undefined) {
    if (options.redis === null || typeof options.redis !== 'object') throw validation('redis', 'must be an object { url } or { urls }');
    refuseUnknown('redis', options.redis, ['url', 'urls']);
  }
  const { lockTTL = 30_000, lockExtendInterval, namespace, coordinationFailureMode = 'strict', asyncContextTracking = true } = options;
  if (typeof asyncContextTracking !== 'boolean') throw validation('asyncContextTracking', 'must be a boolean');
  if (!Number.isSafeInteger(lockTTL) || lockTTL <= 0) throw validation('lockTTL', 'must be a positive safe integer of ms');
  if (lockExtendInterval !== undefined && typeof lockExtendInterval !== 'number') {
    throw validation('lockExtendInterval', 'must be a number of ms');
  }
  if (lockExtendInterval > 0 && lockExtendInterval >= lockTTL) {
    throw validation('lockExtendInterval', 'must be shorter than lockTTL (or 0 to turn renewal off)');
  }
  if (namespace !== undefined && (typeof namespace !== 'string' || namespace === '')) {
    throw validation('namespace', 'must be a non-empty string');
  }
  if (!['strict', 'best-effort'].includes(coordinationFailureMode)) {
    throw validation('coordinationFailureMode', "must be 'strict' or 'best-effort'");
  }
  return {
    lockTTL,
    lockExtendInterval: lockExtendInterval ?? Math.floor(lockTTL / 2),
    namespace,
    coordinationFailureMode,
    asyncContextTracking,
  };
}

class MutexManager {
  /**
   * @param {{ adapter?: object, redis?: { url?: string, urls?: string[] }, namespace?: string,
   *   lockTTL?: number, lockExtendInterval?: number,
   *   coordinationFailureMode?: 'strict' | 'best-effort' }} [options]
   */
  constructor(options) {
    const checked = checkOptions(options);
    this._mutexes = new Map(); // id -> { hold, queue, waiting }
    /** Waits in progress, with the holds of their chains: the local wait-for graph. */
    this._waits = new Set();
    this._tracking = checked.asyncContextTracking;
    this._als = this._tracking ? new AsyncLocalStorage() : new StackTracker();
    this._owned = undefined;
    this._options = checked;
    let adapter = options && options.adapter;
    if (options && options.redis) {
      // Loaded here so that a local manager never loads the Redis entry point.
      const { RedisAdapter } = require('./redis.js');
      const { url, urls } = options.redis;
      // Several URLs are independent servers coordinated by Redlock (a majority grants); a
      // Cluster goes through `adapter: new RedisAdapter({ urls, cluster: true })`.
      const list = urls === undefined ? undefined : [].concat(urls);
      if (list && list.length > 1) {
        const { RedlockAdapter } = require('./redlock.js');
        adapter = new RedlockAdapter({ urls: list });
      } else {
        adapter = new RedisAdapter(list ? { url: list[0] } : { url });
      }
      this._owned = adapter;
    }
    // A lock's token names the chain that took it, so the owner of a key can be read from the
    // key itself and uncontended acquisitions publish nothing extra. `_tokenChain` is set right
    // before each acquisition, whose token is made synchronously when it starts.
    this._tokenChain = 'none';
    this._locker = adapter
      ? new Locker({
          adapter,
          retry: { retries: Infinity, delay: 25 },
          token: () => `${this._tokenChain}.${randomBytes(12).toString('hex')}`,
        })
      : undefined;
    const adapterId = adapter && adapter[NATIVE_ID];
    this._coordination = adapterId !== undefined && native.supportsCoordination(adapterId) ? adapterId : undefined;
  }

  /** A detached context token, for propagating ownership by hand. */
  createContext() {
    return new MutexRunContext();
  }

  /** The context of the operation running now, if any. */
  getCurrentContext() {
    return this._als.getStore()?.context;
  }

  /**
   * True when contexts follow async hops on their own (AsyncLocalStorage); false with
   * `asyncContextTracking: false`, where a nested call after an await needs `context`.
   */
  isAsyncContextTrackingSupported() {
    return this._tracking;
  }

  /** Closes what the manager owns (a Redis adapter made from `redis` options). */
  async dispose() {
    if (this._owned) await this._owned.close();
  }

  _mutex(id) {
    let m = this._mutexes.get(id);
    if (m === undefined) {
      // waiting: this process's requests in the backend's queue (distributed managers only)
      m = { hold: undefined, queue: [], waiting: 0 };
      this._mutexes.set(id, m);
    }
    return m;
  }

  /**
   * The holds a new wait by `context` stands for. With AsyncLocalStorage: those of the calling
   * chain, so a branch that shares a context but holds nothing is no part of a cycle. Without
   * it the chain cannot be told apart from its siblings: every hold of the context, as it is
   * when the wait begins.
   */
  _chainHolds(context, frame) {
    if (this._tracking) return frame?.holds ?? NO_HOLDS;
    const holds = [];
    for (const m of this._mutexes.values()) if (m.hold?.context === context) holds.push(m.hold);
    return holds;
  }

  /**
   * The cycle that a wait for `id` by a chain holding `holds` would close, as mutex ids
   * starting and ending at `id`, or undefined: the holder of `id`, a wait of that holder's
   * chain, the holder of what it waits for, and so on back to one of `holds`.
   */
  _cycle(holds, id) {
    // A chain that holds nothing cannot be waited for, so it closes no cycle.
    if (holds.length === 0) return undefined;
    const seen = new Set();
    const walk = (mutexId, path) => {
      const hold = this._mutexes.get(mutexId)?.hold;
      if (hold === undefined || seen.has(hold)) return undefined;
      if (holds.includes(hold)) return [...path, id];
      seen.add(hold);
      for (const wait of this._waits) {
        if (!wait.holds.includes(hold)) continue;
        const cycle = walk(wait.id, [...path, wait.id]);
        if (cycle) return cycle;
      }
      return undefined;
    };
    return walk(id, [id]);
  }

  /**
   * Runs `operation` under mutex `id`: FIFO per id, re-entrant within one call chain.
   * @returns {Promise<any>} the operation's result, or undefined when waitIfLocked is false and
   *   the mutex was taken.
   */
  async runOperation(id, operation, options = {}) {
    if (typeof id !== 'string' || id === '') throw validation('id', 'must be a non-empty string');
    if (typeof operation !== 'function') throw validation('operation', 'must be a function');
    if (options === null || typeof options !== 'object') throw validation('options', 'must be an object');
    refuseUnknown('', options, ['waitIfLocked', 'timeoutMs', 'signal', 'onAbort', 'context']);
    const { waitIfLocked = true, timeoutMs, signal, onAbort } = options;
    const requestTime = Date.now();
    const frame = this._als.getStore();
    const context = options.context ?? frame?.context ?? new MutexRunContext();
    const chainHolds = this._chainHolds(context, frame);
    if (context.held.has(id)) {
      // Re-entry: the chain already owns the mutex.
      context.held.set(id, context.held.get(id) + 1);
      const hold = this._mutexes.get(id).hold;
      const holds = chainHolds.includes(hold) ? chainHolds : [...chainHolds, hold];
      const letGo = () => context.held.set(id, context.held.get(id) - 1);
      return await this._run(id, operation, new Frame(context, holds), requestTime, new AbortController(), hold.lock, signal, letGo);
    }
    const mutex = this._mutex(id);
    if (this._locker) return this._runShared(id, mutex, operation, context, chainHolds, requestTime, options);
    const free = mutex.hold === undefined && mutex.queue.length === 0;
    if (!free) {
      if (!waitIfLocked) return undefined;
      const cycle = this._cycle(chainHolds, id);
      if (cycle) throw new MutexDeadlockError(id, cycle);
      if (timeoutMs !== undefined && timeoutMs <= 0) throw new MutexTimeoutError(id, timeoutMs);
    }
    const abort = new AbortController();
    if (signal?.aborted) throw new MutexAbortedError(id, signal.reason);
    // Awaited even when free: that tick measured faster with 8 contenders on one id.
    await (free ? this._take(id, mutex, context) : this._wait(id, mutex, context, chainHolds, { timeoutMs, signal, onAbort, abort }));
    context.held.set(id, 1);
    const holds = chainHolds.length === 0 ? [mutex.hold] : [...chainHolds, mutex.hold];
    const letGo = () => {
      context.held.delete(id);
      this._release(id, mutex);
    };
    // `_run` inlined: one async call less per operation on the hot path.
    const running = this._invoke(id, operation, new Frame(context, holds), requestTime, abort, undefined);
    if (signal !== undefined) return this._settle(id, running, signal, abort, letGo);
    try {
      return await running;
    } finally {
      letGo();
    }
  }

  /**
   * runOperation on a distributed manager. The shared lock alone orders the requests, those of
   * this process among them: every request waits in the backend's queue from the moment it is
   * made, so requests from several managers are served in the order they were made. The local
   * record only says which chain of this process holds the mutex, for re-entry and deadlock
   * detection.
   */
  async _runShared(id, mutex, operation, context, chainHolds, requestTime, { waitIfLocked = true, timeoutMs, signal, onAbort }) {
    if (mutex.hold !== undefined) {
      // Another chain of this process holds it: no need to ask the backend to know.
      if (!waitIfLocked) return undefined;
      const cycle = this._cycle(chainHolds, id);
      if (cycle) throw new MutexDeadlockError(id, cycle);
      if (timeoutMs !== undefined && timeoutMs <= 0) throw new MutexTimeoutError(id, timeoutMs);
    }
    if (signal?.aborted) throw new MutexAbortedError(id, signal.reason);
    // A wait whose chain holds nothing is no link of a cycle.
    const waiting = chainHolds.length > 0 ? { id, holds: chainHolds } : undefined;
    if (waiting) this._waits.add(waiting);
    mutex.waiting++;
    let lock;
    try {
      const chainTokens = chainHolds.map((h) => h.token).filter(Boolean);
      const waitSignal = onAbort ? this._onAbortSignal(onAbort, signal) : signal;
      lock = await this._distributed(id, context, { waitIfLocked, timeoutMs, signal: waitSignal, requestTime, chainTokens });
    } finally {
      mutex.waiting--;
      if (waiting) this._waits.delete(waiting);
      if (!lock) this._forget(id, mutex);
    }
    if (lock === null) return undefined;
    const hold = new Hold(id, context);
    hold.token = lock.token;
    hold.lock = lock;
    mutex.hold = hold;
    context.held.set(id, 1);
    const letGo = () => {
      context.held.delete(id);
      // A hold whose lease ran out may already have been replaced by the next one.
      if (mutex.hold === hold) mutex.hold = undefined;
      return lock[Symbol.asyncDispose]()
        .catch(() => {})
        .then(() => this._forget(id, mutex));
    };
    const holds = chainHolds.length === 0 ? [hold] : [...chainHolds, hold];
    return await this._run(id, operation, new Frame(context, holds), requestTime, new AbortController(), lock, signal, letGo);
  }

  /** A signal that aborts with `signal` or when the `onAbort` hook is called: ends a wait only. */
  _onAbortSignal(onAbort, signal) {
    const hook = new AbortController();
    onAbort((reason) => hook.abort(reason));
    return signal ? AbortSignal.any([signal, hook.signal]) : hook.signal;
  }

  /** Runs the callback of a granted operation, then `letGo`; with a signal, through `_settle`. */
  async _run(id, operation, frame, requestTime, abort, lock, signal, letGo) {
    const running = this._invoke(id, operation, frame, requestTime, abort, lock);
    if (signal !== undefined) return this._settle(id, running, signal, abort, letGo);
    try {
      return await running;
    } finally {
      const done = letGo();
      if (done) await done;
    }
  }

  /**
   * The caller's view of a running callback: its outcome, or MutexAbortedError as soon as
   * `signal` aborts (the callback's abortSignal aborts too). `letGo` runs once the callback has
   * settled, whichever came first: the mutex stays held while the callback still runs.
   */
  async _settle(id, running, signal, abort, letGo) {
    const finished = running.then(
      (value) => ({ value }),
      (error) => ({ error }),
    );
    const released = finished.then(letGo);
    let onAbort;
    const aborted = new Promise((resolve) => {
      onAbort = () => {
        abort.abort(signal.reason);
        resolve();
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    });
    const first = await Promise.race([finished, aborted]);
    signal.removeEventListener('abort', onAbort);
    if (first === undefined) {
      released.catch(() => {});
      throw new MutexAbortedError(id, signal.reason);
    }
    await released;
    if ('error' in first) throw first.error;
    return first.value;
  }

  _take(id, mutex, context) {
    mutex.hold = new Hold(id, context);
  }

  /** Queues `context` for `mutex`; resolves once `_release` has made it the holder. */
  _wait(id, mutex, context, holds, { timeoutMs, signal, onAbort, abort }) {
    if (timeoutMs === undefined && signal === undefined && onAbort === undefined && holds.length === 0) {
      // Nothing can make this wait leave the queue, and it is no link of a cycle.
      return new Promise((grant) => mutex.queue.push({ context, grant }));
    }
    return new Promise((resolve, reject) => {
      const entry = { context, grant: undefined };
      const waiting = { id, holds };
      let timer;
      const leave = (error) => {
        const at = mutex.queue.indexOf(entry);
        if (at !== -1) mutex.queue.splice(at, 1);
        this._waits.delete(waiting);
        clearTimeout(timer);
        signal?.removeEventListener('abort', onSignal);
        abort.abort(error);
        reject(error);
      };
      const onSignal = () => leave(new MutexAbortedError(id, signal.reason));
      entry.grant = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onSignal);
        this._waits.delete(waiting);
        resolve();
      };
      mutex.queue.push(entry);
      // A wait whose chain holds nothing is no link of a cycle.
      if (holds.length > 0) this._waits.add(waiting);
      if (timeoutMs !== undefined) timer = setTimeout(() => leave(new MutexTimeoutError(id, timeoutMs)), timeoutMs);
      signal?.addEventListener('abort', onSignal, { once: true });
      if (onAbort) onAbort((reason) => mutex.queue.includes(entry) && leave(new MutexAbortedError(id, reason)));
    });
  }

  /** Drops the record of a mutex nobody here holds or waits for. */
  _forget(id, mutex) {
    if (mutex.hold === undefined && mutex.waiting === 0 && this._mutexes.get(id) === mutex) this._mutexes.delete(id);
  }

  _release(id, mutex) {
    mutex.hold = undefined;
    const next = mutex.queue.shift();
    if (next) {
      this._take(id, mutex, next.context);
      next.grant();
    } else this._mutexes.delete(id);
  }

  /** The cross-process lease behind a local grant; null when waitIfLocked is false and taken. */
  async _distributed(id, context, { waitIfLocked, timeoutMs, signal, requestTime, chainTokens }) {
    const o = this._options;
    const key = o.namespace
      ? `uniquemutex-v2:${encodeURIComponent(o.namespace)}:${encodeURIComponent(id)}`
      : `uniquemutex:${id}`;
    const ttl = o.lockTTL;
    const autoExtend =
      o.lockExtendInterval > 0
        ? { interval: Math.min(o.lockExtendInterval, Math.floor(ttl / 2)), maxHold: 2 ** 31 - 1 }
        : undefined;
    try {
      this._tokenChain = context.id;
      const attempt = this._locker.tryAcquire(key, { ttl, autoExtend });
      const first = await this._bounded(attempt, id, timeoutMs, requestTime, signal).catch((error) => {
        attempt.then((late) => late?.release().catch(() => {}), () => {});
        throw error;
      });
      if (first || !waitIfLocked) return first;
      if (timeoutMs !== undefined && timeoutMs <= 0) throw new MutexTimeoutError(id, timeoutMs);
      const nested = chainTokens.length > 0;
      if (nested && this._coordination !== undefined) {
        return await this._coordinatedWait(id, key, context, { ttl, autoExtend, timeoutMs, signal, requestTime, chainTokens });
      }
      if (nested && o.coordinationFailureMode === 'strict') {
        // Wait-for edges across processes are not published yet, so a chain that holds a
        // mutex and waits for another could deadlock unseen: strict mode refuses that wait.
        throw new DistributedLockError(
          `mutex ${JSON.stringify(id)}: a call chain that holds a mutex cannot wait for another across ` +
            "processes without wait-for metadata, which this manager does not publish yet; use coordinationFailureMode: 'best-effort'",
        );
      }
      return await this._acquireQueued(key, context, { ttl, autoExtend, signal, timeoutMs, requestTime });
    } catch (error) {
      if (error instanceof LoccoError && error.code.startsWith('MUTEX_')) throw error;
      // Out of budget is a timeout; a grant that came too late is the backend's slowness.
      if (error && error.code === 'LOCK_HELD' && error.reason !== 'late-acquire') throw new MutexTimeoutError(id, timeoutMs);
      if (signal?.aborted && error === signal.reason) throw new MutexAbortedError(id, signal.reason);
      throw new DistributedLockError(`could not take the distributed lock of mutex ${JSON.stringify(id)}`, error);
    }
  }

  /** A queued acquisition of `key` for `context`, within what is left of the caller's timeout. */
  _acquireQueued(key, context, { ttl, autoExtend, signal, timeoutMs, requestTime }) {
    const left = timeoutMs === undefined ? undefined : Math.max(0, timeoutMs - (Date.now() - requestTime));
    this._tokenChain = context.id;
    return this._locker.acquire(key, { ttl, autoExtend, signal, retry: { timeout: left } });
  }

  /** One coordination verb against the adapter's backend. */
  _coord(verb, key, value = '', ttl = 1) {
    const opId = nextOpId();
    return Promise.resolve().then(() => answer(native.coordinate(this._coordination, verb, key, value, ttl, opId), opId));
  }

  /**
   * A nested wait across processes: publishes this chain's wait-for edge (what it waits for and
   * the tokens it holds, its ownership generation), then polls, looking for a cycle through the
   * other chains' edges each time the key is still taken.
   */
  async _coordinatedWait(id, key, context, { ttl, autoExtend, timeoutMs, signal, requestTime, chainTokens }) {
    const strict = this._options.coordinationFailureMode === 'strict';
    const coordinationFailed = (error) => {
      if (strict) {
        throw new DistributedLockError(`mutex ${JSON.stringify(id)}: wait-for metadata could not be written or read`, error);
      }
    };
    const edgeKey = EDGE_PREFIX + context.id;
    const edge = JSON.stringify({ id, key, holds: chainTokens });
    let published = true;
    await this._bounded(this._coord(PUT, edgeKey, edge, ttl), id, timeoutMs, requestTime, signal).catch((error) => {
      published = false;
      if (error instanceof MutexTimeoutError || error instanceof MutexAbortedError) throw error;
      coordinationFailed(error);
    });
    // The wait itself is an ordinary queued acquisition, so a nested request keeps its place in
    // the backend's queue; the cycle checks run beside it until it is granted.
    const stop = new AbortController();
    const acquiring = this._acquireQueued(key, context, {
      ttl,
      autoExtend,
      signal: signal ? AbortSignal.any([signal, stop.signal]) : stop.signal,
      timeoutMs,
      requestTime,
    });
    const granted = acquiring.then((lock) => ({ lock }));
    granted.catch(() => {}); // its failure is read from `acquiring` when the loop stops early
    let lock;
    try {
      for (let pause = 5; ; pause = Math.min(pause * 2, 100)) {
        const cycle = await this._bounded(this._findCycle(context, chainTokens, id, key), id, timeoutMs, requestTime, signal).catch(
          (error) => {
            if (error instanceof MutexTimeoutError || error instanceof MutexAbortedError) throw error;
            return coordinationFailed(error);
          },
        );
        // Every chain in the cycle sees it; one of them gives way, the same one for all: the
        // chain with the highest id. The others keep waiting for the lock it then releases.
        if (cycle && cycle.chains.every((c) => c <= context.id)) {
          stop.abort();
          // Granted while the cycle was read: nothing waits any more, so nothing deadlocks.
          lock = await acquiring.catch(() => undefined);
          if (lock) return lock;
          throw new MutexDeadlockError(id, cycle.ids);
        }
        const won = await Promise.race([granted, sleep(pause)]);
        if (won) return (lock = won.lock);
      }
    } finally {
      if (!lock) {
        // Gave up (deadlock, timeout, abort, coordination failure): leave the queue, and release
        // a lock granted after all rather than leak it.
        stop.abort();
        acquiring.then((late) => late.release().catch(() => {}), () => {});
      }
      // Not awaited: the edge expires with the lease anyway, and a stopped server must not
      // hold up the caller.
      if (published) this._coord(DELETE, edgeKey).catch(() => {});
    }
  }

  /** `promise`, unless the caller's timeout or signal comes first; that I/O is bounded too. */
  _bounded(promise, id, timeoutMs, requestTime, signal) {
    if (timeoutMs === undefined && signal === undefined) return promise;
    return new Promise((resolve, reject) => {
      let timer;
      const onAbort = () => done(reject, new MutexAbortedError(id, signal.reason));
      const done = (settle, value) => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        settle(value);
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
      if (timeoutMs !== undefined) {
        const left = timeoutMs - (Date.now() - requestTime);
        timer = setTimeout(() => done(reject, new MutexTimeoutError(id, timeoutMs)), Math.max(0, left));
      }
      promise.then(
        (v) => done(resolve, v),
        (e) => done(reject, e),
      );
    });
  }

  /**
   * The cycle that this chain's wait for `key` closes, as mutex ids and the chains in it: owner
   * of the key, that owner's current wait edge, the owner of what it waits for, and so on back
   * to this chain. An edge whose recorded tokens do not include the owner's token is stale and
   * ends the walk.
   */
  async _findCycle(context, chainTokens, id, key) {
    const path = [id];
    const seen = new Set();
    for (let k = key, hops = 0; hops < 64; hops++) {
      const token = await this._coord(PEEK, k);
      const chain = token && chainOf(token);
      if (!chain) return undefined;
      if (chain === context.id) {
        const ours = chainTokens.includes(token);
        return ours ? { ids: [...path, id], chains: [...seen, context.id] } : undefined;
      }
      if (seen.has(chain)) return undefined;
      seen.add(chain);
      const raw = await this._coord(GET, EDGE_PREFIX + chain);
      if (!raw) return undefined;
      const edge = JSON.parse(raw);
      if (!edge.holds.includes(token)) return undefined;
      path.push(edge.id);
      k = edge.key;
    }
    return undefined;
  }

  /** Runs the callback in `frame`; a promise of its outcome, even when it throws at once. */
  async _invoke(id, operation, frame, requestTime, abort, lock) {
    const mutex = this._mutexes.get(id);
    const { context } = frame;
    const abortSignal = lock ? AbortSignal.any([abort.signal, lock.signal]) : abort.signal;
    const args = {
      requestTime,
      startTime: Date.now(),
      currentMutex: { id, queueSize: mutex ? mutex.queue.length + mutex.waiting : 0, isLocked: true },
      // A plain array (typed readonly): freezing it, or a getter here, made every call 2.5x slower.
      heldMutexIds: [...context.held.keys()],
      contextToken: context,
      abortSignal,
    };
    if (lock) {
      args.assertLock = () => {
        if (lock.state !== 'held') throw new LockExtensionError(id, lock.signal.reason);
      };
    }
    return this._als.run(frame, () => operation(args));
  }
}

module.exports = {
  MutexManager,
  MutexRunContext,
  MutexTimeoutError,
  MutexAbortedError,
  MutexDeadlockError,
  DistributedLockError,
  LockExtensionError,
  MutexLockedError,
};
