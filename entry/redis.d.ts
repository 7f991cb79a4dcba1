import type { LockAdapter } from '../index.js';
export { RedisReplicationError } from '../index.js';

export interface RedisAdapterOptions {
  /** One server: redis:// or rediss://, with user and password in the URL. */
  url?: string;
  /** Seed nodes of a Cluster (with cluster: true). */
  urls?: string[];
  cluster?: boolean;
  /** Ms to establish a connection. Default 5000. */
  connectTimeout?: number;
  /** Ms to wait for one answer. Default 5000. */
  commandTimeout?: number;
  /** A grant or extension counts only once `replicas` replicas acknowledged it within `timeout` ms. Not on a Cluster. */
  waitForReplicas?: { replicas: number; timeout: number };
  /** PEM certificate(s) to trust for rediss://. */
  tls?: { ca?: string | Uint8Array };
}

/**
 * Locks in Redis or Valkey; the engine owns the connections.
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { RedisAdapter } from 'locco-rs/redis';
 *
 * await using adapter = new RedisAdapter({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' });
 * const locker = new Locker({ adapter });
 * ```
 */
export declare class RedisAdapter implements LockAdapter, AsyncDisposable {
  constructor(options: RedisAdapterOptions);
  acquire(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  release(input: { key: string; token: string }): Promise<boolean>;
  extend(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  isHeld(input: { key: string; token: string }): Promise<boolean>;
  acquireFenced(input: { key: string; token: string; ttl: number }): Promise<number | null>;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
  /** Checks the deployment against what the locks rely on; reads only. Findings, unsafe first. */
  checkSafety(options?: import('../index.js').SafetyCheckOptions): Promise<import('../index.js').SafetyFinding[]>;
}

export interface RedlockAdapterOptions {
  /** At least 3 independent servers (an odd number is best): redis:// or rediss://, one standalone server each. */
  urls: string[];
  /** Ms to establish a connection to one server. Default 5000. */
  connectTimeout?: number;
  /** Ms after which a silent server's connection is closed and reopened. Default 5000. */
  commandTimeout?: number;
  /** Ms to wait for any one server's answer; an acquire or extension waits at most a tenth of its TTL. Default 250. */
  serverTimeout?: number;
  /** PEM certificate(s) to trust for rediss://. */
  tls?: { ca?: string | Uint8Array };
}

/**
 * Locks over several independent Redis servers (Redlock): granted when a majority grants
 * within the lease. No fencing tokens (use the PostgreSQL or etcd backend) and no fair queue.
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { RedlockAdapter } from 'locco-rs/redis';
 *
 * await using adapter = new RedlockAdapter({ urls: ['redis://10.0.0.1:6379', 'redis://10.0.0.2:6379', 'redis://10.0.0.3:6379'] });
 * const locker = new Locker({ adapter });
 * ```
 */
export declare class RedlockAdapter implements LockAdapter, AsyncDisposable {
  constructor(options: RedlockAdapterOptions);
  acquire(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  release(input: { key: string; token: string }): Promise<boolean>;
  extend(input: { key: string; token: string; ttl: number }): Promise<boolean>;
  isHeld(input: { key: string; token: string }): Promise<boolean>;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
  /** Checks the deployment against what the locks rely on; reads only. Findings, unsafe first. */
  checkSafety(options?: import('../index.js').SafetyCheckOptions): Promise<import('../index.js').SafetyFinding[]>;
}
