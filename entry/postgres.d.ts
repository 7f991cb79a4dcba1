import type { LockAdapter } from '../index.js';

export interface PostgresAdapterOptions {
  /** postgres://user:password@host:port/db; sslmode=require encrypts, verify-full also checks the certificate. */
  url: string;
  /**
   * Plain or schema-qualified identifier. Default 'locco_locks'. In advisory mode it names
   * the fence sequence `<tableName>_fence` and the lock space string keys are hashed in.
   */
  tableName?: string;
  /**
   * Create the table and the fence sequence on first use. Default true. In advisory mode:
   * create the fence sequence on the first fenced acquire (no table is made).
   */
  createTable?: boolean;
  /** Connections in the pool. Default 10. In advisory mode each held lock keeps one. */
  poolSize?: number;
  /**
   * 'table' (default): one row per key. 'advisory': a session-level `pg_try_advisory_lock`
   * on a connection held for the lock's life; lost at once when that connection drops.
   */
  mode?: 'table' | 'advisory';
  /**
   * Advisory mode only. 'hash' (default): SHA-256 of `<tableName>:<key>`, first 8 bytes as a
   * signed 64-bit integer. 'integer': the key is a decimal signed 64-bit integer, used as is.
   */
  keys?: 'hash' | 'integer';
  /** Ms to establish a connection. Default 5000. */
  connectTimeout?: number;
  /** PEM certificate(s) to trust for TLS. */
  tls?: { ca?: string | Uint8Array };
}

/**
 * Locks in a PostgreSQL table, or advisory locks held by sessions (mode: 'advisory'); the
 * engine owns the pool.
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
  /** Deletes expired rows; answers how many (always 0 in advisory mode). */
  sweepExpired(): Promise<number>;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
  /** Checks the deployment against what the locks rely on; reads only. Findings, unsafe first. */
  checkSafety(options?: import('../index.js').SafetyCheckOptions): Promise<import('../index.js').SafetyFinding[]>;
}

/** The statements for a migration: the table and its sequence <tableName>_fence. */
export declare function postgresLocksDdl(tableName?: string): string;
