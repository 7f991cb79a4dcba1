'use strict';

/** The root of every error locco-rs raises. `code` is stable; match on it across copies. */
class LoccoError extends Error {
  constructor(message, code, options) {
    super(message, options && 'cause' in options ? { cause: options.cause } : undefined);
    this.name = new.target.name;
    this.code = code;
  }
}

/** The key could not be taken within the retry budget. `holder` names who had it, when known. */
class LockHeldError extends LoccoError {
  constructor(message, { key, attempts, elapsedMs, reason, holder } = {}) {
    super(message, 'LOCK_HELD');
    this.key = key;
    this.attempts = attempts;
    this.elapsedMs = elapsedMs;
    this.reason = reason;
    /** The current holder's label (its `holder` option), when it gave one and the backend could tell. */
    this.holder = holder;
  }
}

/** The lease was lost. From withLock, `completed` and `result` tell what the work returned. */
class LockLostError extends LoccoError {
  constructor(message, { key, reason, cause, completed, result } = {}) {
    super(message, 'LOCK_LOST', cause === undefined ? undefined : { cause });
    this.key = key;
    this.reason = reason;
    if (completed !== undefined) {
      this.completed = completed;
      this.result = result;
    }
  }
}

/** An operation the lock's state does not allow, such as extend after release. */
class LockStateError extends LoccoError {
  constructor(message) {
    super(message, 'LOCK_STATE');
  }
}

/** A wrong argument, or a backend set up wrong. `field` names the culprit. */
class ValidationError extends LoccoError {
  constructor(message, { field } = {}) {
    super(message, 'LOCK_VALIDATION');
    this.field = field;
  }
}

/**
 * The backend failed (connection, timeout, auth, protocol). Never contention. `operation`
 * ('acquire', 'release', 'extend', 'isHeld') and `key` say what was being done.
 */
class BackendError extends LoccoError {
  constructor(message, { backend, kind, serverCode } = {}) {
    super(message, 'LOCK_BACKEND');
    this.backend = backend;
    this.kind = kind;
    if (serverCode !== undefined) this.serverCode = serverCode;
    this.operation = undefined;
    this.key = undefined;
  }
}

/**
 * Names the operation and key on a BackendError (in its fields and, unless the engine already
 * did, its message); answers `error`, whatever it is.
 */
function nameOperation(error, operation, key) {
  if (!(error instanceof BackendError) || error.operation !== undefined) return error;
  error.operation = operation;
  error.key = key;
  const what = `${operation} of ${JSON.stringify(key)}`;
  if (!error.message.includes(what)) {
    const head = error.message.match(/^[^:]*backend error \([^)]*\): /);
    const at = head ? head[0].length : 0;
    error.message = `${error.message.slice(0, at)}${what}: ${error.message.slice(at)}`;
  }
  return error;
}

/**
 * `waitForReplicas`: fewer replicas acknowledged a grant or extension than asked. Thrown rather
 * than answering false, which would claim another holder has the key.
 */
class RedisReplicationError extends LoccoError {
  constructor(message, { replicas, acknowledged } = {}) {
    super(message, 'LOCK_REDIS_REPLICATION');
    this.replicas = replicas;
    this.acknowledged = acknowledged;
  }
}

function validation(field, message) {
  return new ValidationError(`invalid ${field}: ${message}`, { field });
}

module.exports = {
  LoccoError,
  LockHeldError,
  LockLostError,
  LockStateError,
  ValidationError,
  BackendError,
  nameOperation,
  RedisReplicationError,
  validation,
};
