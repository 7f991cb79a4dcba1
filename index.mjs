// The ESM entry re-exports the CommonJS one, so both share one set of classes and
// `instanceof` holds whichever way the package was loaded.
import cjs from './index.js';

export const {
  Locker,
  Lock,
  LockSet,
  exponentialBackoff,
  LoccoError,
  LockHeldError,
  LockLostError,
  LockStateError,
  ValidationError,
  BackendError,
  RedisReplicationError,
} = cjs;
