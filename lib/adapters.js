'use strict';

const { native, answer, nextOpId, jsAdapterId, own, ADAPTER_METHODS, QUEUE_METHODS } = require('./native.js');
const { validation } = require('./errors.js');

const NATIVE_ID = Symbol.for('locco-rs.adapterId');
const [ACQUIRE, RELEASE, EXTEND, IS_HELD, ACQUIRE_FENCED] = [0, 1, 2, 3, 4];

/** Calls one method of a built-in (native) adapter, as a promise. */
function callNative(adapterId, method, input) {
  if (input === null || typeof input !== 'object') {
    return Promise.reject(validation('input', 'must be an object { key, token, ttl? }'));
  }
  const { key, token, ttl } = input;
  if (typeof key !== 'string') return Promise.reject(validation('key', `must be a string, got ${typeof key}`));
  if (typeof token !== 'string') return Promise.reject(validation('token', `must be a string, got ${typeof token}`));
  if (ttl !== undefined && typeof ttl !== 'number') {
    return Promise.reject(validation('ttl', 'must be a number of ms'));
  }
  try {
    const opId = nextOpId();
    return Promise.resolve(answer(native.adapterCall(adapterId, method, key, token, ttl ?? 0, opId), opId));
  } catch (error) {
    return Promise.reject(error);
  }
}

/** Ties a built-in adapter object to its native id; the engine lets go of it once the object is collected. */
function bindNative(adapter, id) {
  Object.defineProperty(adapter, NATIVE_ID, { value: id });
  own(adapter, 'adapter', id);
}

/** The five adapter methods of a built-in adapter, each one call into the engine. */
class NativeAdapter {
  acquire(input) {
    return callNative(this[NATIVE_ID], ACQUIRE, input);
  }
  release(input) {
    return callNative(this[NATIVE_ID], RELEASE, input);
  }
  extend(input) {
    return callNative(this[NATIVE_ID], EXTEND, input);
  }
  isHeld(input) {
    return callNative(this[NATIVE_ID], IS_HELD, input);
  }
  acquireFenced(input) {
    return callNative(this[NATIVE_ID], ACQUIRE_FENCED, input);
  }
  /** Checks the deployment against what the locks rely on (see lib/doctor.js). */
  checkSafety(options) {
    return require('./doctor.js').checkSafety(this[NATIVE_ID], options);
  }
}

/**
 * The engine's view of `adapter`: `[id]` for a built-in adapter, `[id, fenced, queued]` for
 * one written in JavaScript (`fenced`: it has acquireFenced; `queued`: the queue methods).
 */
function adapterRef(adapter) {
  if (adapter === null || typeof adapter !== 'object') {
    throw validation('adapter', 'is required: pass an adapter such as new InMemoryAdapter()');
  }
  if (adapter[NATIVE_ID] !== undefined) return [adapter[NATIVE_ID], undefined, undefined];
  for (const name of ADAPTER_METHODS.slice(0, 4)) {
    if (typeof adapter[name] !== 'function') {
      throw validation(
        'adapter',
        `is not a lock adapter: its ${name} is ${typeof adapter[name]}, not a function ` +
          '(an adapter has acquire, release, extend and isHeld, and may have acquireFenced)',
      );
    }
  }
  if (adapter.acquireFenced !== undefined && typeof adapter.acquireFenced !== 'function') {
    throw validation('adapter', 'acquireFenced, when present, must be a function');
  }
  const queue = QUEUE_METHODS.filter((name) => typeof adapter[name] === 'function');
  if (queue.length > 0 && queue.length < QUEUE_METHODS.length) {
    const missing = QUEUE_METHODS.filter((name) => !queue.includes(name));
    throw validation('adapter', `has ${queue.join(' and ')} but not ${missing.join(' or ')}: a queueing adapter has all of ${QUEUE_METHODS.join(', ')}`);
  }
  return [jsAdapterId(adapter), typeof adapter.acquireFenced === 'function', queue.length > 0];
}

module.exports = { NativeAdapter, adapterRef, bindNative, NATIVE_ID };
