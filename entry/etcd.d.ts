import type { LockAdapter } from '../index.js';

export interface EtcdAdapterOptions {
  /** One per member: 'host:port' or 'http(s)://host:port'. */
  endpoints: string[];
  /** etcd's user/password authentication. */
  auth?: { username: string; password: string };
  /** TLS: the PEM of the CA that signed the members' certificates (endpoints become https). */
  tls?: { ca?: string };
  /** Prefix of every lock key. Default 'locco/'. */
  prefix?: string;
  /** TTL of the adapter's session lease in ms, rounded up to whole seconds. Default 10000, at least 2000. */
  sessionTtl?: number;
  /** Ms to connect. Default 5000. */
  connectTimeout?: number;
  /** Ms for one request. Default 5000. */
  requestTimeout?: number;
}

/**
 * Locks as etcd keys attached to one session lease per adapter; fencing tokens are revisions.
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { EtcdAdapter } from 'locco-rs/etcd';
 *
 * await using adapter = new EtcdAdapter({ endpoints: ['127.0.0.1:2379'] });
 * const locker = new Locker({ adapter });
 * ```
 */
export declare class EtcdAdapter implements LockAdapter, AsyncDisposable {
  constructor(options: EtcdAdapterOptions);
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
