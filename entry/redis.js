'use strict';

const { RedisAdapter } = require('../lib/backends/redis.js');
const { RedisReplicationError } = require('../lib/errors.js');
const { RedlockAdapter } = require('../lib/backends/redlock.js');

module.exports = { RedisAdapter, RedisReplicationError, RedlockAdapter };
