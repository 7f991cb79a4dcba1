'use strict';
// The in-memory adapter: the engine's own backend, in this process.
const { native, registerClock } = require('../native.js');
const { NativeAdapter, NATIVE_ID, bindNative } = require('../adapters.js');
const { validation } = require('../errors.js');
const { refuseUnknown } = require('../options.js');

/**
 * Locks in this process's memory: for tests, and for one process that wants the Locker's
 * semantics without a server. Waiters are woken in arrival order when a key is released.
 */
class InMemoryAdapter extends NativeAdapter {
  /** @param {{ now?: () => number }} [options] */
  constructor(options = {}) {
    super();
    if (options === null || typeof options !== 'object') {
      throw validation('options', 'must be an object');
    }
    refuseUnknown('', options, ['now']);
    if (options.now !== undefined && typeof options.now !== 'function') {
      throw validation('now', 'must be a function returning milliseconds');
    }
    const clockId = options.now ? registerClock(options.now) : undefined;
    bindNative(this, native.createMemoryAdapter(clockId));
  }

  /** Forgets every lock; the fencing counters stay, so tokens keep growing. */
  clear() {
    native.memoryClear(this[NATIVE_ID]);
  }
}

module.exports = { InMemoryAdapter };
