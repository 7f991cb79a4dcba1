import type { LockAdapter } from './index.js';

export interface PostgresAdapterOptions {
  /** postgres://user:password@host:port/db; sslmode=require encrypts, verify-full also checks the certificate. */
  url: string;
  /** Plain or schema-qualified identifier. Default 'locco_locks'. */
  tableName?: string;
  /** Create the table and the fence sequence on first use. Default true. */
  createTable?: boolean;
  /** Connections in the pool. Default 10. */
  poolSize?: number;
  /** Ms to establish a connection. Default 5000. */
  connectTimeout?: number;
  /** PEM certificate(s) to trust for TLS. */
  tls?: { ca?: string | Uint8Array };
}

/**
 * Locks in a PostgreSQL table; the engine owns the pool.
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { PostgresAdapter } from 'locco-rs/postgres';
 *
 * await using adapter = new PostgresAdapter({ url: 'postgres://app:secret@127.0.0.1:5432/app' });
 * const locker = new Locker({ adapter, fencing: true });
 * ```
 */
export declare class PostgresAdapter implements LockAdapter, AsyncDisposable {
  constructor(options: PostgresAdapterOptions);
  acquire(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  release(input: { key: string; token: string }): Promise<boolean>;
  extend(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  isHeld(input: { key: string; token: string }): Promise<boolean>;
  acquireFenced(input: { key: string; token: string; ttl: number }): Promise<number | null>;
  /** Deletes expired rows; answers how many. */
  sweepExpired(): Promise<number>;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** The statements for a migration: the table and its sequence <tableName>_fence. */
export declare function postgresLocksDdl(tableName?: string): string;
