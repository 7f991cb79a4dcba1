import type { LockAdapter, LoccoError } from './index.js';

/** A logical call chain: pass it as `context` to carry ownership across hops by hand. */
export declare class MutexRunContext {
  readonly id: string;
}

export interface MutexManagerOptions {
  /** Any locco-rs adapter: serialises across processes. Without one, in this process only. */
  adapter?: LockAdapter;
  /** Shorthand: a RedisAdapter the manager owns (closed by dispose()). */
  redis?: { url?: string; urls?: string | string[] };
  /** A distinct lock domain. */
  namespace?: string;
  /** Lease length in ms (positive safe integer). Default 60000. */
  lockTTL?: number;
  /** Renewal interval in ms, shorter than lockTTL; 0 or less turns renewal off. Default lockTTL/3. */
  lockExtendInterval?: number;
  /** What a nested distributed wait does without wait-for metadata. Default 'strict'. */
  coordinationFailureMode?: 'strict' | 'best-effort';
}

export interface MutexOperationContext {
  requestTime: number;
  startTime: number;
  currentMutex: { id: string; queueSize: number; isLocked: boolean };
  heldMutexIds: ReadonlySet<string>;
  contextToken: MutexRunContext;
  abortSignal: AbortSignal;
  /** Distributed only: throws LockExtensionError once the lease is lost. */
  assertLock?: () => void;
}

export interface RunOperationOptions {
  /** Default true. false: resolve undefined without running when the mutex is taken. */
  waitIfLocked?: boolean;
  /** Ms to wait before MutexTimeoutError; 0 or less is one immediate attempt. */
  timeoutMs?: number;
  context?: MutexRunContext;
  signal?: AbortSignal;
  onAbort?: (abort: (reason?: unknown) => void) => void;
}

export declare class MutexManager {
  constructor(options?: MutexManagerOptions);
  runOperation<T>(id: string, operation: (ctx: MutexOperationContext) => T | Promise<T>, options?: RunOperationOptions): Promise<T | undefined>;
  createContext(): MutexRunContext;
  getCurrentContext(): MutexRunContext | undefined;
  isAsyncContextTrackingSupported(): boolean;
  dispose(): Promise<void>;
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
