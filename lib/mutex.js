'use strict';
// locco-rs/mutex: per-id FIFO mutexes in one process, re-entrant per async call chain, with
// deadlock detection before any wait; distributed across processes through any locco-rs
// adapter when one is given.

const { AsyncLocalStorage } = require('node:async_hooks');
const { randomUUID } = require('node:crypto');
const { LoccoError, validation } = require('./errors.js');
const { Locker } = require('./locker.js');

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

/** A logical call chain: what it holds (with re-entry counts) and what it waits for. */
class MutexRunContext {
  constructor() {
    this.id = randomUUID();
    /** @type {Map<string, number>} */
    this.held = new Map();
    /** @type {string | undefined} */
    this.waitingFor = undefined;
  }
}

function checkOptions(options) {
  if (options === undefined) return {};
  if (options === null || typeof options !== 'object') throw validation('options', 'must be an object');
  const { lockTTL = 60_000, lockExtendInterval, namespace, coordinationFailureMode = 'strict' } = options;
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
  return { lockTTL, lockExtendInterval: lockExtendInterval ?? Math.floor(lockTTL / 3), namespace, coordinationFailureMode };
}

class MutexManager {
  /**
   * @param {{ adapter?: object, redis?: { url?: string, urls?: string[] }, namespace?: string,
   *   lockTTL?: number, lockExtendInterval?: number,
   *   coordinationFailureMode?: 'strict' | 'best-effort' }} [options]
   */
  constructor(options) {
    const checked = checkOptions(options);
    this._mutexes = new Map(); // id -> { owner, queue: [] }
    this._als = new AsyncLocalStorage();
    this._owned = undefined;
    this._options = checked;
    let adapter = options && options.adapter;
    if (options && options.redis) {
      // Loaded here so that a local manager never loads the Redis entry point.
      const { RedisAdapter } = require('./redis.js');
      const { url, urls } = options.redis;
      adapter = new RedisAdapter(urls ? { urls: [].concat(urls), cluster: [].concat(urls).length > 1 } : { url });
      this._owned = adapter;
    }
    this._locker = adapter ? new Locker({ adapter, retry: { retries: Infinity, delay: 25 } }) : undefined;
  }

  /** A detached context token, for propagating ownership by hand. */
  createContext() {
    return new MutexRunContext();
  }

  /** The context of the operation running now, if any. */
  getCurrentContext() {
    return this._als.getStore();
  }

  /** True: Node.js has AsyncLocalStorage, so contexts follow async hops on their own. */
  isAsyncContextTrackingSupported() {
    return true;
  }

  /** Closes what the manager owns (a Redis adapter made from `redis` options). */
  async dispose() {
    if (this._owned) await this._owned.close();
  }

  _mutex(id) {
    let m = this._mutexes.get(id);
    if (m === undefined) {
      m = { owner: undefined, queue: [] };
      this._mutexes.set(id, m);
    }
    return m;
  }

  /** The cycle that waiting for `id` would close, starting and ending at `id`, or undefined. */
  _cycle(context, id) {
    const path = [id];
    const seen = new Set();
    let owner = this._mutexes.get(id)?.owner;
    while (owner !== undefined && !seen.has(owner)) {
      if (owner === context) return [...path, id];
      seen.add(owner);
      const next = owner.waitingFor;
      if (next === undefined) return undefined;
      path.push(next);
      owner = this._mutexes.get(next)?.owner;
    }
    return undefined;
  }

  /**
   * Runs `operation` under mutex `id`: FIFO per id, re-entrant within one call chain.
   * @returns {Promise<any>} the operation's result, or undefined when waitIfLocked is false and
   *   the mutex was taken.
   */
  async runOperation(id, operation, options = {}) {
    if (typeof id !== 'string' || id === '') throw validation('id', 'must be a non-empty string');
    if (typeof operation !== 'function') throw validation('operation', 'must be a function');
    const { waitIfLocked = true, timeoutMs, signal, onAbort } = options;
    const requestTime = Date.now();
    const context = options.context ?? this._als.getStore() ?? new MutexRunContext();
    if (context.held.has(id)) {
      // Re-entry: the chain already owns the mutex.
      context.held.set(id, context.held.get(id) + 1);
      try {
        return await this._invoke(id, operation, context, requestTime, undefined);
      } finally {
        context.held.set(id, context.held.get(id) - 1);
      }
    }
    const mutex = this._mutex(id);
    const free = mutex.owner === undefined && mutex.queue.length === 0;
    if (!free) {
      if (!waitIfLocked) return undefined;
      const cycle = this._cycle(context, id);
      if (cycle) throw new MutexDeadlockError(id, cycle);
      if (timeoutMs !== undefined && timeoutMs <= 0) throw new MutexTimeoutError(id, timeoutMs);
    }
    const abort = new AbortController();
    if (signal?.aborted) throw new MutexAbortedError(id, signal.reason);
    await (free ? this._take(mutex, context) : this._wait(id, mutex, context, { timeoutMs, signal, onAbort, abort }));
    context.held.set(id, 1);
    let lock;
    try {
      if (this._locker) {
        lock = await this._distributed(id, context, { waitIfLocked, timeoutMs, signal, requestTime });
        if (lock === null) return undefined;
      }
      const onOuterAbort = () => abort.abort(signal.reason);
      signal?.addEventListener('abort', onOuterAbort, { once: true });
      try {
        return await this._invoke(id, operation, context, requestTime, abort, lock);
      } finally {
        signal?.removeEventListener('abort', onOuterAbort);
      }
    } finally {
      context.held.delete(id);
      if (lock) await lock[Symbol.asyncDispose]().catch(() => {});
      this._release(id, mutex);
    }
  }

  _take(mutex, context) {
    mutex.owner = context;
  }

  _wait(id, mutex, context, { timeoutMs, signal, onAbort, abort }) {
    return new Promise((resolve, reject) => {
      const entry = { context, grant: undefined };
      let timer;
      const leave = (error) => {
        const at = mutex.queue.indexOf(entry);
        if (at !== -1) mutex.queue.splice(at, 1);
        context.waitingFor = undefined;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onSignal);
        abort.abort(error);
        reject(error);
      };
      const onSignal = () => leave(new MutexAbortedError(id, signal.reason));
      entry.grant = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onSignal);
        context.waitingFor = undefined;
        mutex.owner = context;
        resolve();
      };
      mutex.queue.push(entry);
      context.waitingFor = id;
      if (timeoutMs !== undefined) timer = setTimeout(() => leave(new MutexTimeoutError(id, timeoutMs)), timeoutMs);
      signal?.addEventListener('abort', onSignal, { once: true });
      if (onAbort) onAbort((reason) => mutex.queue.includes(entry) && leave(new MutexAbortedError(id, reason)));
    });
  }

  _release(id, mutex) {
    mutex.owner = undefined;
    const next = mutex.queue.shift();
    if (next) next.grant();
    else this._mutexes.delete(id);
  }

  /** The cross-process lease behind a local grant; null when waitIfLocked is false and taken. */
  async _distributed(id, context, { waitIfLocked, timeoutMs, signal, requestTime }) {
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
      const first = await this._locker.tryAcquire(key, { ttl, autoExtend });
      if (first || !waitIfLocked) return first;
      if (timeoutMs !== undefined && timeoutMs <= 0) throw new MutexTimeoutError(id, timeoutMs);
      if (context.held.size > 1 && o.coordinationFailureMode === 'strict') {
        // Wait-for edges across processes are not published yet, so a chain that holds a
        // mutex and waits for another could deadlock unseen: strict mode refuses that wait.
        throw new DistributedLockError(
          `mutex ${JSON.stringify(id)}: a call chain that holds a mutex cannot wait for another across ` +
            "processes without wait-for metadata, which this manager does not publish yet; use coordinationFailureMode: 'best-effort'",
        );
      }
      const left = timeoutMs === undefined ? undefined : Math.max(0, timeoutMs - (Date.now() - requestTime));
      return await this._locker.acquire(key, { ttl, autoExtend, signal, retry: { timeout: left } });
    } catch (error) {
      if (error instanceof LoccoError && error.code.startsWith('MUTEX_')) throw error;
      if (error && error.code === 'LOCK_HELD') throw new MutexTimeoutError(id, timeoutMs);
      if (signal?.aborted && error === signal.reason) throw new MutexAbortedError(id, signal.reason);
      throw new DistributedLockError(`could not take the distributed lock of mutex ${JSON.stringify(id)}`, error);
    }
  }

  async _invoke(id, operation, context, requestTime, abort, lock) {
    const mutex = this._mutexes.get(id);
    const abortSignal = lock
      ? AbortSignal.any([(abort ?? new AbortController()).signal, lock.signal])
      : (abort ?? new AbortController()).signal;
    const args = {
      requestTime,
      startTime: Date.now(),
      currentMutex: { id, queueSize: mutex ? mutex.queue.length : 0, isLocked: true },
      heldMutexIds: new Set(context.held.keys()),
      contextToken: context,
      abortSignal,
    };
    if (lock) {
      args.assertLock = () => {
        if (lock.state !== 'held') throw new LockExtensionError(id, lock.signal.reason);
      };
    }
    return this._als.run(context, () => operation(args));
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
