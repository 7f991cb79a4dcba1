// Test servers on free loopback ports, in temporary directories, stopped afterwards. One module
// per server under servers/; this file re-exports them, so tests, benchmarks and scripts import
// every starter from here.
export { freePort, hasCommand } from './servers/common.mjs';
export { testProxy } from './servers/proxy.mjs';
export { redisIsExternal, startRedis, startRedisCluster, valkeyBinary } from './servers/redis.mjs';
export { pgBin, startPostgres } from './servers/postgres.mjs';
export { makeTestCertificates } from './servers/tls.mjs';
export { secantusBinary, startMongo } from './servers/mongo.mjs';
export { startEtcd, startEtcdCluster } from './servers/etcd.mjs';
