import cjs from './mutex.js';

export const {
  MutexManager,
  MutexRunContext,
  MutexTimeoutError,
  MutexAbortedError,
  MutexDeadlockError,
  DistributedLockError,
  LockExtensionError,
  MutexLockedError,
} = cjs;
