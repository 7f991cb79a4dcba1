import type { LockAdapter } from '../index.js';

export interface MongoAdapterOptions {
  /** mongodb:// or mongodb+srv:// */
  url: string;
  /** Default: the URL's database, else 'locco'. */
  dbName?: string;
  /** Default 'locco-locks'; fence counters live in '<collectionName>-fences'. */
  collectionName?: string;
  /** Create the unique index on key and the TTL index on expireAt on first use. Default true. */
  createIndexes?: boolean;
  /** The write concern of every lock write. Default { w: 'majority' }. */
  writeConcern?: { w?: 'majority' | number };
  /** Ms to find a server. Default 5000. */
  connectTimeout?: number;
}

/**
 * Locks in a MongoDB collection; the engine owns the client.
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { MongoAdapter } from 'locco-rs/mongo';
 *
 * await using adapter = new MongoAdapter({ url: 'mongodb://127.0.0.1:27017/?replicaSet=rs0', dbName: 'app' });
 * const locker = new Locker({ adapter });
 * ```
 */
export declare class MongoAdapter implements LockAdapter, AsyncDisposable {
  constructor(options: MongoAdapterOptions);
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

export interface MongoIndexSpec {
  key: Record<string, 1>;
  name: string;
  unique?: boolean;
  expireAfterSeconds?: number;
}

/** The indexes the lock collection needs, in the shape collection.createIndexes() takes. */
export declare function mongoLocksIndexes(): MongoIndexSpec[];
