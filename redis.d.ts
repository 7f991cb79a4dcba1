import type { LockAdapter } from './index.js';
export { RedisReplicationError } from './index.js';

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
}
