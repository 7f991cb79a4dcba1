'use strict';

const { RedisAdapter } = require('./lib/redis.js');
const { RedisReplicationError } = require('./lib/errors.js');

module.exports = { RedisAdapter, RedisReplicationError };
