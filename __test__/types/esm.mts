// The ESM view of the package (resolved through the "import" conditions and the .d.mts files).
// Compiled by __test__/package/types.test.mjs with TypeScript 5.2 and the latest release.
import { Locker, LockHeldError, type Lock } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { RedisAdapter, RedisReplicationError } from 'locco-rs/redis';
import { PostgresAdapter, postgresLocksDdl } from 'locco-rs/postgres';
import { MongoAdapter, mongoLocksIndexes } from 'locco-rs/mongo';
import { MutexManager, LockExtensionError } from 'locco-rs/mutex';
import { runLockAdapterContract } from 'locco-rs/testing';
import { lockMetrics } from 'locco-rs/otel';
// @ts-expect-error the ESM entry has no default export, at runtime or in its types
import locco from 'locco-rs';

const locker = new Locker({ adapter: new InMemoryAdapter() });
await using lock: Lock = await locker.acquire('esm', { ttl: 1000 });
const local = new MutexManager();
const n: number = await local.runOperation('esm', () => 1);

void [lock, n, locco, LockHeldError, RedisAdapter, RedisReplicationError, PostgresAdapter, postgresLocksDdl];
void [MongoAdapter, mongoLocksIndexes, LockExtensionError, runLockAdapterContract];
void new Locker({ adapter: new InMemoryAdapter(), onEvent: lockMetrics() });
