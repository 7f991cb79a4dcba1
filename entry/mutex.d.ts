import type { LockAdapter, LoccoError } from '../index.js';

/** A logical call chain: pass it as `context` to carry ownership across hops by hand. */
export declare class MutexRunContext {
  readonly id: string;
}

export interface MutexManagerOptions {
  /** Any locco-rs adapter: serialises across processes. Without one, in this process only. */
  adapter?: LockAdapter;
  /** Shorthand: an adapter the manager owns (closed by dispose()): a RedisAdapter for one URL, a RedlockAdapter (a majority of independent servers) for several. */
  redis?: { url?: string; urls?: string | string[] };
  /** A distinct lock domain. */
  namespace?: string;
  /** Lease length in ms (positive safe integer). Default 30000. */
  lockTTL?: number;
  /** Renewal interval in ms, shorter than lockTTL; 0 or less turns renewal off. Default lockTTL/2. */
  lockExtendInterval?: number;
  /** What a nested distributed wait does without wait-for metadata. Default 'strict'. */
  coordinationFailureMode?: 'strict' | 'best-effort';
  /**
   * Default true (AsyncLocalStorage). false: run as on runtimes without it, where the context
   * follows only the synchronous part of a callback and async hops need `context` by hand.
   */
  asyncContextTracking?: boolean;
}

/** Options of a manager that locks across processes: an adapter, or Redis connection options. */
export type DistributedMutexManagerOptions = MutexManagerOptions &
  ({ adapter: LockAdapter; redis?: undefined } | { redis: { url?: string; urls?: string | string[] }; adapter?: undefined });

/** Options of a manager that serialises in this process only. */
export type LocalMutexManagerOptions = MutexManagerOptions & { adapter?: undefined; redis?: undefined };

interface MutexOperationBase {
  requestTime: number;
  startTime: number;
  currentMutex: { id: string; queueSize: number; isLocked: boolean };
  /** The ids the call context owns, outermost first. */
  heldMutexIds: readonly string[];
  contextToken: MutexRunContext;
  /** Aborts when the operation is aborted or, on a distributed manager, when the lease is lost. */
  abortSignal: AbortSignal;
}

/**
 * What an operation's callback receives. `Distributed` is true for a manager built with an
 * adapter or `redis` options: only those callbacks get `assertLock`.
 */
export type MutexOperationContext<Distributed extends boolean = boolean> = MutexOperationBase &
  (Distributed extends true
    ? {
        /** Throws LockExtensionError once the lease behind the mutex is lost. */
        assertLock: () => void;
      }
    : { assertLock?: undefined });

export interface RunOperationOptions {
  /** Default true. false: resolve undefined without running when the mutex is taken. */
  waitIfLocked?: boolean;
  /** Ms to wait before MutexTimeoutError; 0 or less is one immediate attempt. */
  timeoutMs?: number;
  /**
   * The call chain to run in, passed by hand. Called from inside an operation of the same
   * context, the call is nested in it: it re-enters what the context holds, and a wait stands
   * for that operation's holds. Another context starts a chain of its own.
   */
  context?: MutexRunContext;
  signal?: AbortSignal;
  onAbort?: (abort: (reason?: unknown) => void) => void;
}

/**
 * Whether a manager made with options of type `O` locks across processes: `true` with an
 * `adapter` or `redis` options, `false` with neither, `boolean` when the type cannot tell.
 */
export type IsDistributed<O> = O extends { adapter: LockAdapter } | { redis: { url?: string; urls?: string | string[] } }
  ? true
  : O extends { adapter?: undefined; redis?: undefined }
    ? false
    : boolean;

/**
 * Serialises operations per id: in this process without options, across processes with an
 * adapter or `redis` options. The type parameter is the options' type, inferred from the
 * constructor's argument: it tells the callbacks whether they get `assertLock`.
 *
 * @example
 * ```ts
 * import { MutexManager } from 'locco-rs/mutex';
 * import { RedisAdapter } from 'locco-rs/redis';
 *
 * const local = new MutexManager();
 * await local.runOperation('user:1', async () => updateProfile(1));
 *
 * await using adapter = new RedisAdapter({ url: 'redis://127.0.0.1:6379' });
 * const shared = new MutexManager({ adapter, namespace: 'payments' });
 * await shared.runOperation('user:1', async ({ assertLock, abortSignal }) => {
 *   assertLock(); // throws LockExtensionError once the lease is lost
 *   await chargeCard(1, { signal: abortSignal });
 * });
 * ```
 */
export declare class MutexManager<O extends MutexManagerOptions = MutexManagerOptions> {
  /** Unknown option names are type errors (and ValidationErrors at runtime). */
  constructor(options?: O & { [K in Exclude<keyof O, keyof MutexManagerOptions>]: never });
  /**
   * Runs `operation` under mutex `id`: FIFO per id, re-entrant within one async call chain.
   * Resolves with what the operation returns; with `waitIfLocked: false`, resolves `undefined`
   * without running it when the mutex is taken.
   *
   * @example
   * ```ts
   * const balance = await mutexes.runOperation('account:7', async ({ abortSignal }) => {
   *   return applyPayment(7, { signal: abortSignal });
   * }, { timeoutMs: 5_000 });
   *
   * const maybe = await mutexes.runOperation('account:7', () => 1, { waitIfLocked: false }); // number | undefined
   * ```
   */
  runOperation<T>(
    id: string,
    operation: (ctx: MutexOperationContext<IsDistributed<O>>) => T | Promise<T>,
    options?: RunOperationOptions & { waitIfLocked?: true },
  ): Promise<T>;
  runOperation<T>(
    id: string,
    operation: (ctx: MutexOperationContext<IsDistributed<O>>) => T | Promise<T>,
    options?: RunOperationOptions,
  ): Promise<T | undefined>;
  createContext(): MutexRunContext;
  getCurrentContext(): MutexRunContext | undefined;
  isAsyncContextTrackingSupported(): boolean;
  /** Closes what the manager made itself (the Redis connection of `redis` options). */
  dispose(): Promise<void>;
  /** `await using manager = new MutexManager(…)`: {@link dispose} when the block ends. */
  [Symbol.asyncDispose](): Promise<void>;
}

export declare class MutexTimeoutError extends LoccoError {
  readonly code: 'MUTEX_TIMEOUT';
  readonly id: string;
  readonly timeoutMs: number;
}
export declare class MutexAbortedError extends LoccoError {
  readonly code: 'MUTEX_ABORTED';
  readonly id: string;
  readonly reason: unknown;
}
export declare class MutexDeadlockError extends LoccoError {
  readonly code: 'MUTEX_DEADLOCK';
  readonly requestedId: string;
  readonly cycle: string[];
}
export declare class DistributedLockError extends LoccoError {
  readonly code: 'MUTEX_DISTRIBUTED';
}
export declare class LockExtensionError extends LoccoError {
  readonly code: 'MUTEX_LOCK_EXTENSION';
  readonly id: string;
}
export declare class MutexLockedError extends LoccoError {
  readonly code: 'MUTEX_LOCKED';
  readonly id: string;
}
