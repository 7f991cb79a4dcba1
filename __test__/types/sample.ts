// Uses every public name; compiled by __test__/package/types.test.mjs with TypeScript 5.2 and 6.x.
import {
  BackendError,
  Locker,
  LoccoError,
  Lock,
  LockHeldError,
  LockLostError,
  LockSet,
  LockStateError,
  ValidationError,
  exponentialBackoff,
  type AcquireOptions,
  type DelayFn,
  type HeldKey,
  type KeyInfo,
  type LockAdapter,
  type LockEvent,
  type LostReason,
  type PermitOptions,
  type ReadWriteOptions,
  type RetryOptions,
} from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { runLockAdapterContract } from 'locco-rs/testing';
import { lockMetrics, type LockMetricsMeter, type LockMetricsOptions } from 'locco-rs/otel';
import { metrics } from '@opentelemetry/api';
import { RedisAdapter, RedisReplicationError, RedlockAdapter } from 'locco-rs/redis';
import { PostgresAdapter, postgresLocksDdl } from 'locco-rs/postgres';
import { MongoAdapter, mongoLocksIndexes, type MongoIndexSpec } from 'locco-rs/mongo';
import {
  MutexManager,
  MutexDeadlockError,
  MutexTimeoutError,
  type DistributedMutexManagerOptions,
  type MutexOperationContext,
} from 'locco-rs/mutex';

const adapter: LockAdapter = new InMemoryAdapter({ now: () => performance.now() });
const delay: DelayFn = exponentialBackoff({ base: 50, max: 1000, factor: 2, jitter: true });
const retry: RetryOptions = { retries: 5, delay, timeout: 2000 };
const locker = new Locker({
  adapter,
  retry,
  keyPrefix: 'app:',
  fencing: true,
  token: () => 'tok',
  now: () => performance.now(),
  onEvent(event: LockEvent) {
    if (event.type === 'lost') {
      const reason: LostReason = event.reason;
      void reason;
    }
  },
});

export async function use(): Promise<number> {
  const options: AcquireOptions = { ttl: 1000, autoExtend: { maxHold: 10_000, interval: 300, maxEventLoopLag: 300 } };
  await using lock: Lock = await locker.acquire('k', options);
  const fence: number | undefined = lock.fence;
  const state: 'held' | 'lost' | 'released' = lock.state;
  await lock.extend(2000);
  const held: boolean = await lock.isHeld();
  const signal: AbortSignal = lock.signal;
  const maybe: Lock | null = await locker.tryAcquire('t', { ttl: 100 });
  await locker.acquire('labelled', { ttl: 100, holder: 'worker-1' });
  const info: KeyInfo = await locker.inspect('labelled');
  const left: number | undefined = info.ttlLeft;
  const who: string | undefined = info.holder;
  const listed: HeldKey[] = await locker.list({ prefix: 'l', limit: 10 });
  const forced: boolean = await locker.forceRelease(listed[0]?.key ?? 'labelled');
  console.log(info.held, info.fence, left, who, forced);
  await using set: LockSet = await locker.acquireMany(['a', 'b'], { ttl: 1000 });
  await using permit: Lock = await locker.acquirePermit('p', { limit: 3, ttl: 1000, retry: { timeout: 500 } });
  const spare: Lock | null = await locker.tryAcquirePermit('p', { limit: 3, ttl: 1000 });
  await using reading: Lock = await locker.acquireRead('rw', { ttl: 1000, maxReaders: 8 });
  const writing: Lock | null = await locker.tryAcquireWrite('rw', { ttl: 1000 });
  const readOptions: ReadWriteOptions = { ttl: 1000 };
  const permitOptions: PermitOptions = { ttl: 1000, limit: 2, signal };
  await locker.acquireWrite('rw', readOptions);
  console.log(spare?.key, writing?.fence, permitOptions.limit);
  // @ts-expect-error a permit needs its limit
  await locker.acquirePermit('p', { ttl: 1000 });
  // @ts-expect-error a try takes no retry
  await locker.tryAcquireRead('rw', { ttl: 1000, retry: { retries: 1 } });
  const n = await locker.withLock('w', { ttl: 1000 }, async (l) => l.heldMs);
  try {
    await locker.acquire('x', { ttl: 1, signal });
  } catch (e) {
    if (e instanceof LockHeldError) console.log(e.attempts, e.elapsedMs, e.reason, e.holder);
    if (e instanceof LockLostError) console.log(e.completed, e.result, e.reason);
    if (e instanceof ValidationError) console.log(e.field);
    if (e instanceof BackendError) console.log(e.backend, e.kind);
    if (e instanceof LockStateError || e instanceof LoccoError) console.log(e.code);
  }
  void [fence, state, held, maybe, set.locks.length];
  return n;
}

runLockAdapterContract('InMemoryAdapter', () => ({ adapter: new InMemoryAdapter() }));
runLockAdapterContract('async', async () => ({ adapter, cleanup: async () => {} }));

export async function redis(): Promise<void> {
  await using adapter = new RedisAdapter({
    url: 'redis://user:pw@127.0.0.1:6379',
    connectTimeout: 1000,
    commandTimeout: 1000,
    waitForReplicas: { replicas: 1, timeout: 100 },
    tls: { ca: '-----BEGIN CERTIFICATE-----' },
  });
  const cluster = new RedisAdapter({ urls: ['redis://a:1', 'redis://b:2'], cluster: true });
  await cluster.close();
  await using redlock = new RedlockAdapter({ urls: ['redis://a:1', 'redis://b:1', 'redis://c:1'], serverTimeout: 100 });
  await new Locker({ adapter: redlock }).tryAcquire('k', { ttl: 1000 });
  try {
    await new Locker({ adapter }).acquire('k', { ttl: 1000 });
  } catch (e) {
    if (e instanceof RedisReplicationError) console.log(e.replicas, e.acknowledged);
  }
}

export async function postgres(): Promise<number> {
  const ddl: string = postgresLocksDdl('app.locks');
  await using adapter = new PostgresAdapter({
    url: 'postgres://app:pw@127.0.0.1:5432/app?sslmode=verify-full',
    tableName: 'app.locks',
    createTable: false,
    poolSize: 4,
    connectTimeout: 1000,
    tls: { ca: ddl },
  });
  return adapter.sweepExpired();
}

export async function mongo(): Promise<string> {
  const specs: MongoIndexSpec[] = mongoLocksIndexes();
  await using adapter = new MongoAdapter({
    url: 'mongodb://127.0.0.1:27017',
    dbName: 'app',
    collectionName: 'locks',
    createIndexes: false,
    writeConcern: { w: 'majority' },
    connectTimeout: 1000,
  });
  const lock = await new Locker({ adapter, fencing: true }).acquire('k', { ttl: 1000 });
  return `${specs[0].name} ${lock.fence}`;
}

export async function mutex(): Promise<number | undefined> {
  const m = new MutexManager({ adapter: new InMemoryAdapter(), namespace: 'app', lockTTL: 10_000 });
  try {
    // Waiting (the default) always runs the operation: its result, never undefined.
    const size: number = await m.runOperation('id', async (ctx: MutexOperationContext) => ctx.heldMutexIds.length, {
      timeoutMs: 100,
      context: m.createContext(),
    });
    const waited: string = await m.runOperation('id', () => 'ran', { waitIfLocked: true });
    // @ts-expect-error waitIfLocked: false may resolve undefined
    const skipped: number = await m.runOperation('id', () => 1, { waitIfLocked: false });
    const maybe: number | undefined = await m.runOperation('id', () => 1, { waitIfLocked: Math.random() > 0.5 });
    // A distributed manager's callback always gets assertLock.
    await m.runOperation('id', ({ assertLock }) => assertLock());
    void [waited, skipped, maybe];
    return size;
  } catch (e) {
    if (e instanceof MutexDeadlockError) console.log(e.cycle);
    if (e instanceof MutexTimeoutError) console.log(e.timeoutMs);
    return undefined;
  } finally {
    await m.dispose();
  }
}

export async function localMutex(): Promise<void> {
  const local = new MutexManager();
  const shared = new MutexManager({ redis: { url: 'redis://127.0.0.1:6379' } });
  await local.runOperation('id', (ctx) => {
    // @ts-expect-error a local manager has no lease to assert
    ctx.assertLock();
  });
  await shared.runOperation('id', (ctx) => ctx.assertLock());
  const anyManager: MutexManager = Math.random() > 0.5 ? local : shared;
  await anyManager.runOperation('id', (ctx) => ctx.assertLock?.());
  const typed: MutexManager<DistributedMutexManagerOptions> = shared;
  await typed.runOperation('id', (ctx) => ctx.assertLock());
  // @ts-expect-error an unknown option name is refused
  new MutexManager({ adapter: new InMemoryAdapter(), lockTtl: 1000 });
  await shared.dispose();
}

// A manager can be subclassed.
export class AuditedMutexManager extends MutexManager {
  readonly log: string[] = [];
}
export class SharedAuditedMutexManager extends MutexManager<DistributedMutexManagerOptions> {
  run(id: string): Promise<void> {
    return this.runOperation(id, ({ assertLock }) => assertLock());
  }
}
new SharedAuditedMutexManager({ adapter: new InMemoryAdapter() });

// adapter.checkSafety(): every built-in adapter has it; a finding's severity is a union.
import type { SafetyFinding } from 'locco-rs';
export async function unsafeFindings(adapter: RedisAdapter | PostgresAdapter | MongoAdapter | InMemoryAdapter): Promise<SafetyFinding[]> {
  const findings = await adapter.checkSafety({ clockSampleMs: 500 });
  await adapter.checkSafety();
  // @ts-expect-error the sample length is a number of ms
  await adapter.checkSafety({ clockSampleMs: '3s' });
  const severity: 'unsafe' | 'warning' | 'info' = findings[0].severity;
  void severity;
  return findings.filter((f) => f.severity === 'unsafe' && f.why.length > 0 && f.fix.length > 0);
}

// An OpenTelemetry Meter fits lockMetrics' meter; the handler fits onEvent.
const otelMeter: LockMetricsMeter = metrics.getMeter('app');
const metricsOptions: LockMetricsOptions = { meter: otelMeter, group: (key) => key.split('/')[0] };
new Locker({ adapter, onEvent: lockMetrics(metricsOptions) });
new Locker({ adapter, onEvent: lockMetrics() });
// @ts-expect-error group maps a key to a string
lockMetrics({ group: (key: string) => key.length });
