'use strict';
// locco-rs/mutex: per-id FIFO mutexes in one process, re-entrant per async call chain, with
// deadlock detection before any wait; distributed across processes through any locco-rs
// adapter when one is given.

const { AsyncLocalStorage } = require('node:async_hooks');
const { randomUUID } = require('node:crypto');
const { LoccoError, validation } = require('./errors.js');
const { refuseUnknown } = require('./options.js');
const { Locker } = require('./locker.js');
const { NATIVE_ID } = require('./adapters.js');
const { native, answer, nextOpId, drainReleased } = require('./native.js');

const [PEEK, PUT, GET, DELETE] = [0, 1, 2, 3];
const EDGE_PREFIX = 'locco-meta:wait:';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
/** Ms between a distributed waiter's attempts when no push comes (the fair queue pushes). */
const RETRY_DELAY = 25;

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

/** The waits of a record written by _fileWait; nothing for a missing or foreign value. */
function recordedWaits(raw) {
  let waits;
  try {
    waits = raw ? JSON.parse(raw) : [];
  } catch {
    return [];
  }
  if (!Array.isArray(waits)) return [];
  return waits.filter((x) => x && typeof x.w === 'string' && typeof x.id === 'string' && typeof x.key === 'string');
}

/**
 * This process's requests for one key of one backend that have no place in the backend's
 * queue yet, in the order they were made. Only the first talks to the backend; the next one
 * starts once it has its place (or the lock, or gave up). So the backend's queue gets this
 * process's requests in the order they were made, whichever managers and connections they go
 * out over: otherwise they would race, and land in whatever order their connections delivered.
 */
class Turn {
  constructor(lines, key) {
    let line = lines.get(key);
    if (line === undefined) {
      line = [];
      lines.set(key, line);
    }
    this._lines = lines;
    this._key = key;
    this._line = line;
    this._gone = false;
    this._go = undefined;
    /** @type {Promise<void> | undefined} resolves once this request may talk to the backend; undefined: at once */
    this.ready = line.push(this) === 1 ? undefined : new Promise((resolve) => (this._go = resolve));
  }

  /** This request has its place, the lock, or gave up: the next one may go. Idempotent. */
  leave() {
    if (this._gone) return;
    this._gone = true;
    const line = this._line;
    const at = line.indexOf(this);
    line.splice(at, 1);
    if (line.length === 0) {
      if (this._lines.get(this._key) === line) this._lines.delete(this._key);
    } else if (at === 0) line[0]._go();
  }
}

/**
 * The lines of this process, per backend: managers made from the same `redis` options share
 * them, as do managers given the same adapter object.
 */
const linesByUrl = new Map();
const linesByAdapter = new WeakMap();
function linesOf(table, backend) {
  let lines = table.get(backend);
  if (lines === undefined) {
    lines = new Map();
    table.set(backend, lines);
  }
  return lines;
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
    /** token -> this manager's waits filed under it in the backend's records (see _fileWait) */
    this._edges = new Map();
    this._tracking = checked.asyncContextTracking;
    this._als = this._tracking ? new AsyncLocalStorage() : new StackTracker();
    this._owned = undefined;
    this._options = checked;
    let adapter = options && options.adapter;
    let lines = adapter ? linesOf(linesByAdapter, adapter) : undefined;
    if (options && options.redis) {
      // Loaded here so that a local manager never loads the Redis entry point.
      const { RedisAdapter } = require('./backends/redis.js');
      const { url, urls } = options.redis;
      // Several URLs are independent servers coordinated by Redlock (a majority grants); a
      // Cluster goes through `adapter: new RedisAdapter({ urls, cluster: true })`.
      const list = urls === undefined ? undefined : [].concat(urls);
      if (list && list.length > 1) {
        const { RedlockAdapter } = require('./backends/redlock.js');
        adapter = new RedlockAdapter({ urls: list });
      } else {
        adapter = new RedisAdapter(list ? { url: list[0] } : { url });
      }
      this._owned = adapter;
      lines = linesOf(linesByUrl, JSON.stringify(list ?? [url]));
    }
    /** This process's lines for the manager's backend (see Turn). */
    this._lines = lines;
    this._locker = adapter ? new Locker({ adapter, retry: { retries: Infinity, delay: RETRY_DELAY } }) : undefined;
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

  /** `await using manager = new MutexManager(…)`: dispose() when the block ends. */
  async [Symbol.asyncDispose]() {
    await this.dispose();
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
   * The holds a new wait by `context` stands for. With AsyncLocalStorage: those of the
   * operations it is nested in, when they run in the same context. An operation given another
   * context (work scheduled from inside a callback, with a token of its own) starts a chain
   * of its own: the callback it was started from may never wait for it, so its waits are no
   * edge from that callback's holds, nor are the holds of other operations that share its
   * token. Without AsyncLocalStorage the chain cannot be told apart from its siblings: every
   * hold of the context, as it is when the wait begins.
   */
  _chainHolds(context, frame) {
    if (this._tracking) return frame !== undefined && frame.context === context ? frame.holds : NO_HOLDS;
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
   * this process among them: every request takes its place in the backend's queue, and this
   * process's requests for one key do so in the order they were made, whichever of its
   * managers made them (see Turn). The local record only says which chain of this process
   * holds the mutex, for re-entry and deadlock detection.
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
      lock = await this._distributed(id, { waitIfLocked, timeoutMs, signal: waitSignal, requestTime, chainTokens });
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
  async _distributed(id, { waitIfLocked, timeoutMs, signal, requestTime, chainTokens }) {
    const o = this._options;
    const key = o.namespace
      ? `uniquemutex-v2:${encodeURIComponent(o.namespace)}:${encodeURIComponent(id)}`
      : `uniquemutex:${id}`;
    const ttl = o.lockTTL;
    const autoExtend =
      o.lockExtendInterval > 0
        ? { interval: Math.min(o.lockExtendInterval, Math.floor(ttl / 2)), maxHold: 2 ** 31 - 1 }
        : undefined;
    // Taken before anything is awaited: the line holds this process's requests in call order.
    const turn = new Turn(this._lines, key);
    try {
      if (turn.ready === undefined) {
        const attempt = this._locker.tryAcquire(key, { ttl, autoExtend });
        const first = await this._bounded(attempt, id, timeoutMs, requestTime, signal).catch((error) => {
          attempt.then((late) => late?.release().catch(() => {}), () => {});
          throw error;
        });
        if (first || !waitIfLocked) return first;
        if (timeoutMs !== undefined && timeoutMs <= 0) throw new MutexTimeoutError(id, timeoutMs);
      } else {
        // An earlier request of this process has no place in the backend's queue yet: the
        // mutex is taken, or about to be, and this request goes after that one, with no try
        // of its own (the queued acquisition's first attempt is one).
        if (!waitIfLocked) return null;
        if (timeoutMs !== undefined && timeoutMs <= 0) throw new MutexTimeoutError(id, timeoutMs);
        await this._bounded(turn.ready, id, timeoutMs, requestTime, signal);
      }
      const queued = { key, turn, ttl, autoExtend, timeoutMs, signal, requestTime };
      const nested = chainTokens.length > 0;
      if (nested && this._coordination !== undefined) return await this._coordinatedWait(id, chainTokens, queued);
      if (nested && o.coordinationFailureMode === 'strict') {
        // Wait-for edges across processes are not published yet, so a chain that holds a
        // mutex and waits for another could deadlock unseen: strict mode refuses that wait.
        throw new DistributedLockError(
          `mutex ${JSON.stringify(id)}: a call chain that holds a mutex cannot wait for another across ` +
            "processes without wait-for metadata, which this manager does not publish yet; use coordinationFailureMode: 'best-effort'",
        );
      }
      return await this._acquireQueued(queued);
    } catch (error) {
      if (error instanceof LoccoError && error.code.startsWith('MUTEX_')) throw error;
      // Out of budget is a timeout; a grant that came too late is the backend's slowness.
      if (error && error.code === 'LOCK_HELD' && error.reason !== 'late-acquire') throw new MutexTimeoutError(id, timeoutMs);
      if (signal?.aborted && error === signal.reason) throw new MutexAbortedError(id, signal.reason);
      throw new DistributedLockError(`could not take the distributed lock of mutex ${JSON.stringify(id)}`, error);
    } finally {
      turn.leave();
    }
  }

  /**
   * A queued acquisition of `key`, within what is left of the caller's timeout. Its turn in
   * this process's line ends with its first miss, which put it in the backend's queue.
   */
  _acquireQueued({ key, turn, ttl, autoExtend, signal, timeoutMs, requestTime }) {
    const left = timeoutMs === undefined ? undefined : Math.max(0, timeoutMs - (Date.now() - requestTime));
    const delay = () => {
      turn.leave();
      return RETRY_DELAY;
    };
    const acquiring = this._locker.acquire(key, { ttl, autoExtend, signal, retry: { timeout: left, delay } });
    // The engine lets go of the delay function with the acquisition; the facade's record of it
    // goes at the next drain, which nothing else may bring soon.
    acquiring.then(drainReleased, drainReleased);
    return acquiring;
  }

  /** One coordination verb against the adapter's backend. */
  _coord(verb, key, value = '', ttl = 1) {
    const opId = nextOpId();
    return Promise.resolve().then(() => answer(native.coordinate(this._coordination, verb, key, value, ttl, opId), opId));
  }

  /**
   * Files `wait` under each of `tokens` in the backend's records, or takes it out: the record
   * `locco-meta:wait:<token>` lists this manager's waits whose chain holds the lock with that
   * token (several branches of one chain may wait at once). Only this manager writes it: the
   * token is one of its own locks.
   */
  _fileWait(wait, tokens, add) {
    const ttl = this._options.lockTTL;
    return Promise.all(
      tokens.map((token) => {
        let waits = this._edges.get(token);
        if (add) {
          if (waits === undefined) this._edges.set(token, (waits = new Set()));
          waits.add(wait);
        } else if (waits !== undefined) {
          waits.delete(wait);
          if (waits.size === 0) this._edges.delete(token);
        }
        const record = EDGE_PREFIX + token;
        return this._edges.has(token) ? this._coord(PUT, record, JSON.stringify([...waits]), ttl) : this._coord(DELETE, record);
      }),
    );
  }

  /**
   * A nested wait across processes: files the wait under the tokens its chain holds, then
   * polls, looking for a cycle through the other processes' records each time the key is
   * still taken.
   */
  async _coordinatedWait(id, chainTokens, queued) {
    const { key, ttl, timeoutMs, signal, requestTime } = queued;
    const strict = this._options.coordinationFailureMode === 'strict';
    const coordinationFailed = (error) => {
      if (strict) {
        throw new DistributedLockError(`mutex ${JSON.stringify(id)}: wait-for metadata could not be written or read`, error);
      }
    };
    // `w` names this wait, so that every process that sees a cycle picks the same one to give way.
    const wait = { w: randomUUID(), id, key };
    const stop = new AbortController();
    let acquiring;
    let lock;
    try {
      let published = true;
      let filedAt = Date.now();
      await this._bounded(this._fileWait(wait, chainTokens, true), id, timeoutMs, requestTime, signal).catch((error) => {
        published = false;
        if (error instanceof MutexTimeoutError || error instanceof MutexAbortedError) throw error;
        coordinationFailed(error);
      });
      // The wait itself is an ordinary queued acquisition, so a nested request keeps its place
      // in the backend's queue; the cycle checks run beside it until it is granted.
      acquiring = this._acquireQueued({ ...queued, signal: signal ? AbortSignal.any([signal, stop.signal]) : stop.signal });
      const granted = acquiring.then((l) => ({ lock: l }));
      granted.catch(() => {}); // its failure is read from `acquiring` when the loop stops early
      for (let pause = 5; ; pause = Math.min(pause * 2, 100)) {
        if (published && Date.now() - filedAt > ttl / 2) {
          // The records live one lease long; a wait that lasts longer files itself again.
          filedAt = Date.now();
          this._fileWait(wait, chainTokens, true).catch(() => {});
        }
        const cycle = await this._bounded(this._findCycle(wait, chainTokens), id, timeoutMs, requestTime, signal).catch((error) => {
          if (error instanceof MutexTimeoutError || error instanceof MutexAbortedError) throw error;
          return coordinationFailed(error);
        });
        // Every wait in the cycle sees it; one of them gives way, the same one for all: the
        // wait with the highest name. The others keep waiting for the lock it then releases.
        if (cycle && cycle.waits.every((w) => w <= wait.w)) {
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
        acquiring?.then((late) => late.release().catch(() => {}), () => {});
      }
      // Not awaited: the records expire with the lease anyway, and a stopped server must not
      // hold up the caller. Taken out even when filing failed, which may have been in part.
      this._fileWait(wait, chainTokens, false).catch(() => {});
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
   * The cycle that `wait` closes, as mutex ids and the names of the waits in it: the owner of
   * the key it waits for, the waits filed under that owner's token, the owners of what they
   * wait for, and so on back to a token of this wait's chain. A record names only waits that
   * stand for the exact lock under the key, so a hold taken or given back later by another
   * operation, even one sharing a context, never joins a cycle.
   */
  async _findCycle(wait, chainTokens) {
    const seen = new Set();
    const walk = async (key, ids, waits) => {
      if (waits.length > 64) return undefined;
      const token = await this._coord(PEEK, key);
      if (!token) return undefined;
      if (chainTokens.includes(token)) return { ids: [...ids, wait.id], waits };
      if (seen.has(token)) return undefined;
      seen.add(token);
      for (const next of recordedWaits(await this._coord(GET, EDGE_PREFIX + token))) {
        const cycle = await walk(next.key, [...ids, next.id], [...waits, next.w]);
        if (cycle) return cycle;
      }
      return undefined;
    };
    return walk(wait.key, [wait.id], [wait.w]);
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
