/**
 * A backend. Built-in adapters come from `locco-rs/memory`, `locco-rs/redis`, `locco-rs/postgres`,
 * `locco-rs/mongo` and `locco-rs/etcd`; any object with these methods works. Each method answers `true` only when
 * the operation applied to the key carrying `token`.
 *
 * @example
 * ```ts
 * const keys = new Map<string, { token: string; until: number }>();
 * const live = (key: string, token: string) => {
 *   const entry = keys.get(key);
 *   return entry !== undefined && entry.token === token && entry.until > Date.now();
 * };
 * const adapter: LockAdapter = {
 *   async acquire({ key, token, ttl }) {
 *     const entry = keys.get(key);
 *     if (entry && entry.until > Date.now()) return false;
 *     keys.set(key, { token, until: Date.now() + ttl });
 *     return true;
 *   },
 *   async release({ key, token }) {
 *     return live(key, token) && keys.delete(key);
 *   },
 *   async extend({ key, token, ttl }) {
 *     if (!live(key, token)) return false;
 *     keys.set(key, { token, until: Date.now() + ttl });
 *     return true;
 *   },
 *   async isHeld({ key, token }) {
 *     return live(key, token);
 *   },
 * };
 * ```
 */
export interface LockAdapter {
  /** Sets key = token with a lease of ttl ms when the key is free or expired. */
  acquire(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  /** Deletes key when it carries token. */
  release(input: { key: string; token: string }): Promise<boolean>;
  /** A new lease of ttl ms from now when key carries token and is live. Never re-creates a key. */
  extend(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  /** Whether key carries token and a live lease. */
  isHeld(input: { key: string; token: string }): Promise<boolean>;
  /** For `fencing: true`: acquire and take the key's next fencing token; null when held. */
  acquireFenced?(input: { key: string; token: string; ttl: number }): Promise<number | null>;
  /**
   * Optional, with leaveQueue and watchQueue (all three or none): a fair queue of waiters per
   * key. Grants only when the key is free and no live waiter is ahead of `waiter` (who then
   * leaves the queue); otherwise puts `waiter` at the back of the key's queue, or keeps its
   * place, for `lease` ms. A plain acquire must then also refuse a free key while anyone waits.
   * `retryIn`: ms until the holder's lease ends, when `waiter` is at the head.
   */
  acquireQueued?(input: {
    key: string;
    token: string;
    ttl: number;
    waiter: string;
    lease: number;
    fenced: boolean;
  }): Promise<{ granted: true; fence?: number } | { granted: false; retryIn?: number }>;
  /** Removes `waiter` from the key's queue (it gave up); wakes the new head of a free key. */
  leaveQueue?(input: { key: string; waiter: string }): Promise<void>;
  /**
   * Called once with `wake`: call `wake(waiter)` when that waiter should try now (the key it
   * waits for was released while it is the head). A missed call costs a re-check, not a lock.
   */
  watchQueue?(wake: (waiter: string) => void): void;
  /**
   * Optional, for `locker.inspect`: what the adapter knows of `key` now (its lease's ms left,
   * its last fencing token, the holder's label: the part of the stored token after
   * `|locco:holder=`). Never the token. Without it, `locker.inspect` rejects naming it.
   */
  inspect?(input: { key: string }): Promise<KeyInfo>;
  /** Optional, for `locker.list`: the held keys starting with `prefix`, at most `limit`. */
  list?(input: { prefix: string; limit: number }): Promise<Array<KeyInfo & { key: string }>>;
  /** Optional, for `locker.forceRelease`: deletes whatever lease holds `key`; true when one did. */
  forceRelease?(input: { key: string }): Promise<boolean>;
}

/** What `locker.inspect` tells about a key. Never its token. */
export interface KeyInfo {
  /** A live lease holds the key. */
  held: boolean;
  /** Ms until the lease ends, by the backend's clock; absent when free or unknown. */
  ttlLeft?: number;
  /** The key's last fencing token, when the backend keeps one per key. */
  fence?: number;
  /** The holder's label (its `holder` option), when it gave one. */
  holder?: string;
}

/** One held key in `locker.list`: its key (without the Locker's keyPrefix) and what inspect tells. */
export interface HeldKey extends KeyInfo {
  key: string;
}

/** What `locker.inspectPermits` tells about a counting semaphore. */
export interface PermitsInfo {
  limit: number;
  /** How many of the permits a live lease holds. */
  held: number;
  holders: HeldKey[];
}

/** What `locker.inspectReadWrite` tells about a read-write lock. */
export interface ReadWriteInfo {
  maxReaders: number;
  /** The write key's holder, or null. */
  writer: HeldKey | null;
  readers: HeldKey[];
}

export interface ListOptions {
  /** Only keys starting with this (after the Locker's keyPrefix). Default: every key. */
  prefix?: string;
  /** At most this many keys. Default 1000. */
  limit?: number;
}

export interface DelayInput {
  /** The attempt that just failed, from 1. */
  attempt: number;
  /** Milliseconds since the acquisition started. */
  elapsedMs: number;
  /** The previous wait, 0 before the first. */
  previousDelay: number;
}

/** Milliseconds to wait before the next attempt. */
export type DelayFn = (input: DelayInput) => number | Promise<number>;

export interface RetryOptions {
  /** Attempts after the first. 0 is one attempt; Infinity runs until timeout or the signal. Default 10. */
  retries?: number;
  /** Milliseconds between attempts, or a function of the attempt. Default 200. */
  delay?: number | DelayFn;
  /** Budget for the whole acquisition, waits included, in ms. Default none. */
  timeout?: number;
  /**
   * What a transient backend failure (a refused or dropped connection, no answer in time) does
   * to an acquisition. `'fail'` (default): it ends it with the BackendError. `'retry'`: it counts
   * as one more attempt, reported by a `backendRetry` event, within `retries` and `timeout`; when
   * they are spent, the last failure is the error. Never turns a failure into contention.
   */
  onBackendError?: 'fail' | 'retry';
}

export interface AutoExtendOptions {
  /** Ms between extensions, counted from when the previous request left. Default ttl/3, at most ttl/2. */
  interval?: number;
  /** Hold deadline in ms from acquisition. Required: a heartbeat always has a deadline. */
  maxHold: number;
  /** An extension goes out only if the event loop ran within this many ms of its due time. Default: the interval. */
  maxEventLoopLag?: number;
}

export interface AcquireOptions {
  /** Lease length in ms: a whole number from 1 to 2^31-1. */
  ttl: number;
  retry?: RetryOptions;
  /** Stops the retry loop; a grant in flight is given back. acquire then rejects with signal.reason. */
  signal?: AbortSignal;
  autoExtend?: AutoExtendOptions;
  /**
   * A label stored with the lock (a host name and pid, a job id), shown by `locker.inspect`,
   * `locco-rs inspect` and a rival's LockHeldError. At most 256 bytes, without `|` or control
   * characters. Default none.
   */
  holder?: string;
}

export interface TryAcquireOptions {
  ttl: number;
  autoExtend?: AutoExtendOptions;
  /** See AcquireOptions.holder. */
  holder?: string;
}

/** Options of acquirePermit: an acquisition's options plus the semaphore's size. */
export interface PermitOptions extends AcquireOptions {
  /**
   * How many holders the semaphore admits at once: a whole number from 1 to 1024. Every
   * holder of one key must pass the same limit.
   */
  limit: number;
}

export interface TryPermitOptions extends TryAcquireOptions {
  limit: number;
}

/** Options of acquireRead / acquireWrite. */
export interface ReadWriteOptions extends AcquireOptions {
  /**
   * How many readers may hold the lock at once (default 32, at most 1024). Every holder of
   * one key must pass the same value: a writer looks at that many read slots.
   */
  maxReaders?: number;
}

export interface TryReadWriteOptions extends TryAcquireOptions {
  maxReaders?: number;
}

export type LostReason =
  | 'extend'
  | 'extend-failed'
  | 'late-extend'
  | 'expired'
  | 'max-hold'
  | 'release'
  | 'observed'
  /** The backend's session that kept the lease ended (a dropped connection), reported at once. */
  | 'session';

export type LockEvent =
  | { type: 'acquired'; key: string; ttl: number; waitedMs: number; attempts: number }
  | { type: 'contended'; key: string; ttl: number; attempt: number; elapsedMs: number; reason: 'held' | 'late' }
  /** An attempt failed on the backend and the acquisition goes on (`retry.onBackendError: 'retry'`, or a queued waiter keeping its place). */
  | { type: 'backendRetry'; key: string; ttl: number; attempt: number; elapsedMs: number; error: unknown }
  | { type: 'extended'; key: string; ttl: number; heldMs: number }
  | { type: 'extendFailed'; key: string; ttl: number; heldMs: number; error: unknown }
  | { type: 'released'; key: string; ttl: number; heldMs: number }
  | { type: 'lost'; key: string; ttl: number; heldMs: number; reason: LostReason; error?: unknown }
  | { type: 'releaseFailed'; key: string; ttl: number; heldMs: number; error: unknown };

export interface LockerOptions {
  adapter: LockAdapter;
  /** Default retry policy; each call can override a field. */
  retry?: RetryOptions;
  /** Prepended to every key. */
  keyPrefix?: string;
  /** Receives every event. What it throws is dropped. */
  onEvent?: (event: LockEvent) => void;
  /** A monotonic clock in ms. Default: the monotonic clock plus pauses the wall clock saw. */
  now?: () => number;
  /**
   * The value stored under a key. Default: 16 random bytes as hex. A token that starts with
   * `locco:reserved|` or contains `|locco:` (the marks of stored values) is refused with a
   * ValidationError naming `token`.
   */
  token?: () => string;
  /** Take a fencing token with every acquisition, as lock.fence. */
  fencing?: boolean;
}

/** A held lease. */
export declare class Lock implements AsyncDisposable {
  private constructor();
  /** The key, prefix included. */
  readonly key: string;
  readonly token: string;
  /** The latest lease length asked for, in ms. */
  readonly ttl: number;
  /** The merged retry policy of the acquisition. */
  readonly retry: Required<Pick<RetryOptions, 'retries' | 'delay' | 'onBackendError'>> & { timeout: number | undefined };
  /** The fencing token of this grant, when the Locker's fencing is on. */
  readonly fence: number | undefined;
  /** Read on the clock: a lease that ran out reads 'lost' even before a timer noticed. */
  readonly state: 'held' | 'lost' | 'released';
  readonly lostReason: LostReason | undefined;
  /** How long the lock was held; stops counting at loss or release. */
  readonly heldMs: number;
  /** Aborts with a LockLostError as its reason on every known loss. */
  readonly signal: AbortSignal;
  /** true when our key was deleted, false when it was gone or another holder's. */
  release(): Promise<boolean>;
  /** A new lease of ttl ms from now, clamped to the hold deadline. */
  extend(ttl: number): Promise<void>;
  /** One look at the backend; a false while held marks the lock lost. */
  isHeld(): Promise<boolean>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** Locks taken together by acquireMany. */
export declare class LockSet implements AsyncDisposable {
  private constructor();
  readonly locks: readonly Lock[];
  /** Aborts when any lock of the set is lost. */
  readonly signal: AbortSignal;
  /** true when every lock deleted its key. */
  release(): Promise<boolean>;
  extend(ttl: number): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** Options of {@link Locker.close}. */
export interface CloseOptions {
  /** `false`: stop the heartbeats and let each lease run out instead of releasing it. Default `true`. */
  release?: boolean;
}

/**
 * Takes leases on keys of one backend.
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { InMemoryAdapter } from 'locco-rs/memory';
 *
 * const locker = new Locker({
 *   adapter: new InMemoryAdapter(),
 *   keyPrefix: 'billing:',
 *   retry: { retries: 5, delay: 100 },
 *   onEvent: (event) => console.log(event.type, event.key),
 * });
 * ```
 */
export declare class Locker {
  constructor(options: LockerOptions);
  /**
   * Acquires key, retrying while another holder has it. Rejects with LockHeldError when the
   * budget runs out, and with `signal.reason` when `signal` aborts first.
   *
   * @example
   * ```ts
   * await using lock = await locker.acquire('invoice:42', { ttl: 10_000 });
   * await sendInvoice(42, { signal: lock.signal }); // released when the block ends
   * ```
   */
  acquire(key: string, options: AcquireOptions): Promise<Lock>;
  /**
   * One attempt: the lock, or null when another holder has the key.
   *
   * @example
   * ```ts
   * const lock = await locker.tryAcquire('cron:cleanup', { ttl: 60_000 });
   * if (lock !== null) {
   *   try {
   *     await cleanup();
   *   } finally {
   *     await lock.release();
   *   }
   * }
   * ```
   */
  tryAcquire(key: string, options: TryAcquireOptions): Promise<Lock | null>;
  /**
   * Acquires, runs fn, releases (also when fn throws). Rejects with LockLostError when fn
   * finished but the lease did not survive it.
   *
   * @example
   * ```ts
   * const total = await locker.withLock(
   *   'report',
   *   { ttl: 30_000, autoExtend: { maxHold: 10 * 60_000 } },
   *   async (lock) => buildReport({ signal: lock.signal }),
   * );
   * ```
   */
  withLock<T>(key: string, options: AcquireOptions, fn: (lock: Lock) => T | Promise<T>): Promise<T>;
  /**
   * Acquires every key in sorted order; one timeout budget, retries per key.
   *
   * @example
   * ```ts
   * await using both = await locker.acquireMany(['account:1', 'account:2'], { ttl: 10_000 });
   * ```
   */
  acquireMany(keys: readonly string[], options: AcquireOptions): Promise<LockSet>;
  /**
   * A permit of the counting semaphore `key`: at most `limit` holders at once. Each permit is
   * a lease of its own on one of `limit` slot keys (`lock.key` is `<key>:permit:<i>`), so a
   * holder that dies frees its permit when its own lease ends. Waiters are served first come,
   * first served: a free permit is taken at once only while nobody waits; otherwise the caller
   * queues for the turn key `<key>:turn` (in the backend's fair queue: in-memory, Redis,
   * PostgreSQL table, MongoDB, etcd, and adapters with the queue methods; on the others the
   * turn is polled at `retry.delay`), and the first in line takes the next permit that frees.
   * `tryAcquirePermit` never waits, so it may take a permit a queued caller was about to get.
   *
   * @example
   * ```ts
   * await using permit = await locker.acquirePermit('pdf-render', { limit: 4, ttl: 60_000 });
   * await render(job, { signal: permit.signal });
   * ```
   */
  acquirePermit(key: string, options: PermitOptions): Promise<Lock>;
  /** One try for a permit: the lock, or null when all `limit` permits are held. */
  tryAcquirePermit(key: string, options: TryPermitOptions): Promise<Lock | null>;
  /**
   * A read of the read-write lock `key`: any number of readers (up to `maxReaders`) at once,
   * never beside a writer. Each reader's lease is its own (`lock.key` is `<key>:read:<i>`).
   * Writers are preferred: while a writer waits, new readers wait too.
   *
   * @example
   * ```ts
   * await using read = await locker.acquireRead('catalog', { ttl: 10_000 });
   * const prices = await loadPrices();
   * ```
   */
  acquireRead(key: string, options: ReadWriteOptions): Promise<Lock>;
  /** One try for a read: the lock, or null when a writer holds or waits for `key`. */
  tryAcquireRead(key: string, options: TryReadWriteOptions): Promise<Lock | null>;
  /**
   * The write of the read-write lock `key`: alone, with no reader and no other writer. It
   * takes `<key>:write` first (so new readers stay out), then waits within the same retry
   * budget for the readers to leave. With `fencing: true` its fence orders the writes.
   *
   * @example
   * ```ts
   * await using write = await locker.acquireWrite('catalog', { ttl: 10_000, retry: { retries: Infinity, timeout: 5_000 } });
   * await savePrices(prices, { fence: write.fence });
   * ```
   */
  acquireWrite(key: string, options: ReadWriteOptions): Promise<Lock>;
  /** One try for the write: the lock, or null when a reader or another writer holds `key`. */
  tryAcquireWrite(key: string, options: TryReadWriteOptions): Promise<Lock | null>;
  /**
   * Releases every lock this Locker still holds (their heartbeats end with them) and frees it.
   * Acquisitions still waiting, and any made afterwards, reject with LockStateError; a grant
   * that arrives after it is given back. Calling it again is harmless; the first call decides.
   *
   * With `{ release: false }` the held locks are not released: their heartbeats stop and each
   * lease runs out on the backend at its own end. That is the "claim and let it expire"
   * pattern (job de-duplication), which `await using` would otherwise undo.
   *
   * @example
   * ```ts
   * await using locker = new Locker({ adapter }); // closed when the block ends
   * await otherLocker.close({ release: false }); // its claims stay until their leases end
   * ```
   */
  close(options?: CloseOptions): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
  /**
   * What the backend knows of `key` now. Rejects on a JavaScript adapter without `inspect`.
   * The PostgreSQL advisory mode tells `held` and `holder` only; it refuses `list` and
   * `forceRelease`.
   *
   * @example
   * ```ts
   * const { held, ttlLeft, holder } = await locker.inspect('report:daily');
   * ```
   */
  inspect(key: string): Promise<KeyInfo>;
  /**
   * The held keys, for operators.
   *
   * @example
   * ```ts
   * for (const k of await locker.list({ prefix: 'jobs:' })) console.log(k.key, k.holder);
   * ```
   */
  list(options?: ListOptions): Promise<HeldKey[]>;
  /**
   * Who holds the counting semaphore `key` of `limit` permits: each held permit's key
   * (`<key>:permit:<i>`) with what inspect tells of it. One inspect per permit.
   * @example
   * const { held, limit, holders } = await locker.inspectPermits('exports', { limit: 3 });
   * console.log(`${held} of ${limit} permits held`, holders.map((h) => h.holder));
   */
  inspectPermits(key: string, options: { limit: number }): Promise<PermitsInfo>;
  /**
   * Who holds the read-write lock `key`: its writer (holding the write key, alone or waiting
   * for the readers to leave) and its readers. One inspect per read slot (`maxReaders`,
   * default 32, as the lock was taken with).
   */
  inspectReadWrite(key: string, options?: { maxReaders?: number }): Promise<ReadWriteInfo>;
  /**
   * Deletes whatever lease holds `key`, whoever holds it; true when one was removed. The holder
   * is not told: it learns at its next extend or isHeld and may write until then, so only
   * fencing tokens checked by the resource keep its late writes out.
   *
   * @example
   * ```ts
   * await locker.forceRelease('report:daily'); // the stuck holder's next extend fails
   * ```
   */
  forceRelease(key: string): Promise<boolean>;
}

export interface ExponentialBackoffOptions {
  /** The first wait, in ms. */
  base: number;
  /** The longest wait, in ms. */
  max: number;
  /** Growth per attempt. Default 2. */
  factor?: number;
  /** Draw each wait from the upper half of its value. Default true. */
  jitter?: boolean;
}

export declare function exponentialBackoff(options: ExponentialBackoffOptions): DelayFn;

export declare class LoccoError extends Error {
  readonly code: string;
}
export declare class LockHeldError extends LoccoError {
  readonly code: 'LOCK_HELD';
  readonly key: string;
  readonly attempts: number;
  readonly elapsedMs: number;
  readonly reason: 'held' | 'late' | 'late-acquire';
  /** The label of the holder that had the key, when it gave one and the backend could tell. */
  readonly holder?: string;
}
export declare class LockLostError<T = unknown> extends LoccoError {
  readonly code: 'LOCK_LOST';
  readonly key: string;
  readonly reason: LostReason;
  readonly cause?: unknown;
  /** From withLock: the work finished (and returned `result`) without a lock. */
  readonly completed?: boolean;
  readonly result?: T;
}
export declare class LockStateError extends LoccoError {
  readonly code: 'LOCK_STATE';
}
export declare class ValidationError extends LoccoError {
  readonly code: 'LOCK_VALIDATION';
  /** The option or argument at fault. */
  readonly field: string;
}
export declare class BackendError extends LoccoError {
  readonly code: 'LOCK_BACKEND';
  readonly backend: string;
  readonly kind: 'io' | 'timeout' | 'auth' | 'tls' | 'protocol' | 'script' | 'config' | 'other';
  readonly serverCode?: string;
  /** What was being done, when a lock operation failed. */
  readonly operation?: 'acquire' | 'release' | 'extend' | 'isHeld';
  /** The key (prefix included) it was done to. */
  readonly key?: string;
}
export declare class RedisReplicationError extends LoccoError {
  readonly code: 'LOCK_REDIS_REPLICATION';
  readonly replicas: number;
  readonly acknowledged: number;
}

/** One finding of `adapter.checkSafety()` (and `locco-rs doctor`). */
export interface SafetyFinding {
  /** Stable and dotted: 'redis.maxmemory-policy', 'postgres.primary-key', 'clock.rate', … */
  id: string;
  /**
   * 'unsafe': the lock can be granted twice, or not at all, in ordinary operation.
   * 'warning': a guarantee weakens in some failure (a restart, a failover). 'info': worth
   * knowing, or a check the server did not let run ("could not check …").
   */
  severity: 'unsafe' | 'warning' | 'info';
  /** What was found, with the values read. */
  message: string;
  /** Why it matters to the locks. */
  why: string;
  /** How to fix it. */
  fix: string;
}

/** Options of `adapter.checkSafety()`. */
export interface SafetyCheckOptions {
  /** Ms to compare this machine's clock rate with the server's. Default 3000; 0 skips it. */
  clockSampleMs?: number;
}
