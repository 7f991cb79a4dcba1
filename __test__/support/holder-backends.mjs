// Every built-in backend as a spec a child process can rebuild: { kind, options }. `start()`
// starts the backend's server once for a test file and answers { spec, dispose }.
import { execFileSync } from 'node:child_process';
import { InMemoryAdapter } from 'locco-rs/memory';
import { EtcdAdapter } from 'locco-rs/etcd';
import { MongoAdapter } from 'locco-rs/mongo';
import { PostgresAdapter } from 'locco-rs/postgres';
import { RedisAdapter, RedlockAdapter } from 'locco-rs/redis';
import { MapAdapter } from './map-adapter.mjs';
import { freePort, startEtcd, startMongo, startPostgres, startRedis } from './servers.mjs';
import { until } from './adapters.mjs';

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
    name: 'Redis Cluster (3 masters)',
    fair: true,
    async start() {
      const nodes = [];
      try {
        for (let i = 0; i < 3; i++) {
          const busPort = await freePort();
          nodes.push(await startRedis({ args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-port', String(busPort)] }));
        }
        const addresses = nodes.map((n) => `127.0.0.1:${n.port}`);
        execFileSync('redis-cli', ['--cluster', 'create', ...addresses, '--cluster-replicas', '0', '--cluster-yes'], { stdio: 'ignore' });
        await until(() => nodes.every((n) => n.cli('CLUSTER', 'INFO').includes('cluster_state:ok')), 15_000);
      } catch (e) {
        await Promise.all(nodes.map((n) => n.dispose()));
        throw e;
      }
      const options = { urls: nodes.map((n) => n.url), cluster: true };
      return { spec: { kind: 'redis', options }, dispose: () => Promise.all(nodes.map((n) => n.dispose())) };
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
