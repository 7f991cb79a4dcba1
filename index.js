'use strict';
// locco-rs: distributed locks with a Rust engine. See README.md.

const errors = require('./lib/errors.js');
const { Locker, Lock, LockSet, exponentialBackoff } = require('./lib/locker.js');

module.exports = {
  Locker,
  Lock,
  LockSet,
  exponentialBackoff,
  LoccoError: errors.LoccoError,
  LockHeldError: errors.LockHeldError,
  LockLostError: errors.LockLostError,
  LockStateError: errors.LockStateError,
  ValidationError: errors.ValidationError,
  BackendError: errors.BackendError,
  RedisReplicationError: errors.RedisReplicationError,
};
