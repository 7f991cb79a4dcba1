'use strict';

const { RedisAdapter } = require('../lib/redis.js');
const { RedisReplicationError } = require('../lib/errors.js');
const { RedlockAdapter } = require('../lib/redlock.js');

module.exports = { RedisAdapter, RedisReplicationError, RedlockAdapter };
