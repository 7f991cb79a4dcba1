'use strict';

const { native, answer, nextOpId } = require('../native.js');
const { NativeAdapter, NATIVE_ID, bindNative } = require('../adapters.js');
const { validation } = require('../errors.js');
const { refuseUnknown, tlsCa } = require('../options.js');
const { checkUrl, URL_PARAMETERS } = require('../url.js');

const REDIS_URL = { schemes: ['redis', 'rediss'], parameters: URL_PARAMETERS.redis };

function optionalMs(field, v) {
  if (v !== undefined && typeof v !== 'number') throw validation(field, 'must be a number of ms');
  return v;
}

/**
 * Locks over several independent Redis or Valkey servers (Redlock): a lock is granted when a
 * majority of the servers grant it within the lease's validity. No fencing tokens (use the
 * PostgreSQL or etcd backend for those) and no fair queue: waiters poll at `retry.delay`.
 */
class RedlockAdapter extends NativeAdapter {
  /**
   * @param {{ urls: string[], connectTimeout?: number, commandTimeout?: number,
   *   serverTimeout?: number, tls?: { ca?: string | Buffer } }} options
   */
  constructor(options) {
    super();
    if (options === null || typeof options !== 'object') throw validation('options', 'must be an object with urls');
    refuseUnknown('', options, ['urls', 'connectTimeout', 'commandTimeout', 'serverTimeout', 'tls']);
    const { urls, tls } = options;
    if (!Array.isArray(urls) || urls.some((u) => typeof u !== 'string')) {
      throw validation('urls', 'is required: an array of at least 3 redis:// or rediss:// URLs, one per independent server');
    }
    if (urls.length < 3) {
      throw validation('urls', `Redlock needs at least 3 independent Redis servers (an odd number such as 3 or 5 is best), got ${urls.length}`);
    }
    urls.forEach((u, i) => checkUrl(`urls[${i}]`, u, REDIS_URL));
    const ca = tlsCa(tls);
    const id = answer(
      native.createRedlockAdapter({
        urls: [...urls],
        connectTimeout: optionalMs('connectTimeout', options.connectTimeout),
        commandTimeout: optionalMs('commandTimeout', options.commandTimeout),
        serverTimeout: optionalMs('serverTimeout', options.serverTimeout),
        tlsCa: ca,
      }),
    );
    bindNative(this, id);
    const opId = nextOpId();
    try {
      const r = answer(native.redlockConnect(id, opId), opId);
      if (r instanceof Promise) r.catch(() => {}); // a failed connect is reported by the operations that need it
    } catch {
      // Likewise.
    }
  }

  /**
   * Closes the connections to every server, once the answers still due from servers slower
   * than the majority have come (each within `serverTimeout`): a release made just before,
   * which resolved at a majority, then reaches every server. Operations afterwards fail with a
   * BackendError.
   */
  async close() {
    const id = this[NATIVE_ID];
    try {
      const opId = nextOpId();
      await answer(native.redlockDrain(id, opId), opId);
    } finally {
      native.closeAdapter(id);
    }
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }
}

// No fencing tokens: the method is absent, so `fencing: true` is refused and the contract
// suite skips its fencing tests.
Object.defineProperty(RedlockAdapter.prototype, 'acquireFenced', { value: undefined });

module.exports = { RedlockAdapter };
