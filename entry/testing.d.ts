import type { LockAdapter } from '../index.js';

export interface ContractRunner {
  describe(name: string, fn: () => void): unknown;
  it(name: string, fn: (ctx?: any) => Promise<void>): unknown;
  beforeEach(fn: () => Promise<void>): unknown;
  afterEach(fn: () => Promise<void>): unknown;
}

/**
 * Registers the adapter contract suite under node:test or vitest (found on its own), or
 * under the runner you pass.
 *
 * @example
 * ```ts
 * import { runLockAdapterContract } from 'locco-rs/testing';
 * import { InMemoryAdapter } from 'locco-rs/memory';
 *
 * runLockAdapterContract('InMemoryAdapter', () => ({ adapter: new InMemoryAdapter() }));
 * ```
 */
export declare function runLockAdapterContract(
  name: string,
  factory: () =>
    | { adapter: LockAdapter; cleanup?: () => unknown }
    | Promise<{ adapter: LockAdapter; cleanup?: () => unknown }>,
  runner?: ContractRunner,
): void;

/** The ways a chaos adapter makes a call go wrong. */
export type ChaosFault = 'fail' | 'late' | 'hang' | 'lostReply' | 'endSession';

export declare const CHAOS_FAULTS: readonly ChaosFault[];
/** The chance of each fault per call when `rates` is not given. */
export declare const DEFAULT_CHAOS_RATES: Readonly<Record<ChaosFault, number>>;

/** What a chaos adapter throws; a Locker passes it through as is. */
export declare class ChaosError extends Error {
  readonly code: 'CHAOS';
  readonly fault: ChaosFault;
  readonly method: string;
  readonly key: string;
  /** Whether the backend applied the call before the error (a lost reply). */
  readonly applied: boolean;
}

export interface ChaosOptions {
  /** Every draw follows from it: the same calls get the same faults. */
  seed: number;
  /** The chance of each fault per call (their sum at most 1). */
  rates?: Partial<Record<ChaosFault, number>>;
  /** Only calls of these methods are faulted (default: every method). */
  methods?: string[];
  /** Moves the clock the backend and its Lockers share (their `now`), for a late answer; without it a late answer waits in real time. */
  advance?: (ms: number) => void;
  /** Timestamps of the log, in ms; default performance.now. */
  now?: () => number;
  /** How late the answer to a call without a ttl comes, in ms; default 1000. */
  lateMs?: number;
}

export interface ChaosCall {
  n: number;
  at: number;
  method: string;
  key: string;
  token?: string;
  ttl?: number;
  fault?: ChaosFault;
  /** Whether the backend granted the key to `token` (even when the answer was then lost). */
  granted: boolean;
  /** 'pending', the answer, or what was thrown. */
  outcome: string;
}

export interface ChaosState {
  /** Every call, in the order made. */
  readonly log: ChaosCall[];
  /** The leases an ended session dropped from the backend. */
  readonly dropped: { key: string; token: string; at: number }[];
  /** Set to true to stop injecting faults. */
  quiet: boolean;
  /** Whether this adapter threw `error`. */
  threw(error: unknown): boolean;
  /** Ends the calls that never answered with a ChaosError, as a connection finally closed would. */
  settleHung(): void;
  /** The log, one line per call. */
  history(): string;
}

/**
 * Wraps `inner` in an adapter whose calls, drawn from `seed`, sometimes fail, answer after
 * the caller's lease, never answer, are applied but answered with an error, or end the
 * session (every lease the adapter granted is dropped).
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { chaosAdapter } from 'locco-rs/testing';
 *
 * const adapter = chaosAdapter(new MyAdapter(), { seed: 42, rates: { fail: 0.1 } });
 * const locker = new Locker({ adapter });
 * // ...exercise the locker, then print adapter.chaos.history() when an assertion fails.
 * ```
 */
export declare function chaosAdapter<A extends LockAdapter>(inner: A, options: ChaosOptions): A & { readonly chaos: ChaosState };
