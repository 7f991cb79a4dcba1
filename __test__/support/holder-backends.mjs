// Every built-in backend as a spec a child process can rebuild: { kind, options }. `start()`
// starts the backend's server once for a test file and answers { spec, dispose }.
import { InMemoryAdapter } from 'locco-rs/memory';
import { EtcdAdapter } from 'locco-rs/etcd';
import { MongoAdapter } from 'locco-rs/mongo';
import { PostgresAdapter } from 'locco-rs/postgres';
import { RedisAdapter, RedlockAdapter } from 'locco-rs/redis';
import { MapAdapter } from './map-adapter.mjs';
import { startEtcd, startMongo, startPostgres, startRedis } from './servers.mjs';

const local = (kind) => async () => ({ spec: { kind, options: {} }, dispose: async () => {} });

export const HOLDER_BACKENDS = [
  { name: 'memory', start: local('memory'), inProcess: true, fair: true },
  { name: 'JavaScript MapAdapter', start: local('map'), inProcess: true },
  {
    name: 'Redis',
    fair: true,
    async start() {
      const redis = await startRedis();
      return { spec: { kind: 'redis', options: { url: redis.url } }, dispose: () => redis.dispose() };
    },
  },
  {
    name: 'Redlock (3 Redis servers)',
    async start() {
      const servers = await Promise.all([0, 1, 2].map(() => startRedis()));
      const urls = servers.map((s) => s.url);
      return { spec: { kind: 'redlock', options: { urls } }, dispose: () => Promise.all(servers.map((s) => s.dispose())) };
    },
  },
  {
    name: 'PostgreSQL',
    fair: true,
    async start() {
      const pg = await startPostgres();
      return { spec: { kind: 'postgres', options: { url: pg.url } }, dispose: () => pg.dispose() };
    },
  },
  {
    name: 'PostgreSQL advisory',
    async start() {
      const pg = await startPostgres();
      return { spec: { kind: 'postgres', options: { url: pg.url, mode: 'advisory' } }, dispose: () => pg.dispose() };
    },
  },
  {
    name: 'MongoDB',
    fair: true,
    async start() {
      const mongo = await startMongo();
      return { spec: { kind: 'mongo', options: { url: mongo.url } }, dispose: () => mongo.dispose() };
    },
  },
  {
    name: 'etcd',
    fair: true,
    async start() {
      const etcd = await startEtcd();
      const options = { endpoints: [etcd.endpoint], sessionTtl: 2000 };
      return { spec: { kind: 'etcd', options }, dispose: () => etcd.dispose() };
    },
    // A crashed holder's keys go with its session lease, not with each lock's own lease.
    crashLease: 2000,
  },
];

const MAKERS = {
  memory: () => new InMemoryAdapter(),
  map: () => new MapAdapter(),
  redis: (o) => new RedisAdapter(o),
  redlock: (o) => new RedlockAdapter(o),
  postgres: (o) => new PostgresAdapter(o),
  mongo: (o) => new MongoAdapter(o),
  etcd: (o) => new EtcdAdapter(o),
};

/** A new adapter for `spec`. One memory/map adapter per spec object, so Lockers share it. */
export function adapterFor(spec) {
  if (spec.kind === 'memory' || spec.kind === 'map') {
    spec.shared ??= MAKERS[spec.kind]();
    return spec.shared;
  }
  return MAKERS[spec.kind](spec.options);
}
