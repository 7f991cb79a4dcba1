import type { LockAdapter } from '../index.js';

/**
 * Locks in this process's memory. Waiters are woken in arrival order on release.
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { InMemoryAdapter } from 'locco-rs/memory';
 *
 * const locker = new Locker({ adapter: new InMemoryAdapter() });
 * ```
 */
export declare class InMemoryAdapter implements LockAdapter {
  /** `now`: the backend's clock in ms (default: the monotonic clock). */
  constructor(options?: { now?: () => number });
  /** Forgets every lock; fencing counters stay. */
  clear(): void;
  acquire(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  release(input: { key: string; token: string }): Promise<boolean>;
  extend(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  isHeld(input: { key: string; token: string }): Promise<boolean>;
  acquireFenced(input: { key: string; token: string; ttl: number }): Promise<number | null>;
  /** Checks the deployment against what the locks rely on; reads only. Findings, unsafe first. */
  checkSafety(options?: import('../index.js').SafetyCheckOptions): Promise<import('../index.js').SafetyFinding[]>;
}
