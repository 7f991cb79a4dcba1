import type { LockAdapter } from './index.js';

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
