import cjs from './redis.js';

export const { RedisAdapter, RedisReplicationError, RedlockAdapter } = cjs;
