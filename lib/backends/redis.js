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
 * Locks in Redis or Valkey, standalone or Cluster. The connections are the engine's own: pass
 * URLs, not a client. Connects in the background at construction.
 */
class RedisAdapter extends NativeAdapter {
  /**
   * @param {{ url?: string, urls?: string[], cluster?: boolean, connectTimeout?: number,
   *   commandTimeout?: number, waitForReplicas?: { replicas: number, timeout: number },
   *   tls?: { ca?: string | Buffer } }} options
   */
  constructor(options) {
    super();
    if (options === null || typeof options !== 'object') throw validation('options', 'must be an object with url or urls');
    refuseUnknown('', options, ['url', 'urls', 'cluster', 'connectTimeout', 'commandTimeout', 'waitForReplicas', 'tls']);
    const { url, urls, cluster = false, waitForReplicas, tls } = options;
    let list;
    if (urls !== undefined) {
      if (!Array.isArray(urls) || urls.length === 0 || urls.some((u) => typeof u !== 'string')) {
        throw validation('urls', 'must be a non-empty array of redis:// or rediss:// URLs');
      }
      list = urls;
      urls.forEach((u, i) => checkUrl(`urls[${i}]`, u, REDIS_URL));
    } else if (typeof url === 'string') {
      checkUrl('url', url, REDIS_URL);
      list = [url];
    } else {
      throw validation('url', 'is required (redis://[user:password@]host:port), or urls with cluster: true');
    }
    if (typeof cluster !== 'boolean') throw validation('cluster', 'must be a boolean');
    if (waitForReplicas !== undefined && (waitForReplicas === null || typeof waitForReplicas !== 'object')) {
      throw validation('waitForReplicas', 'must be an object { replicas, timeout }');
    }
    if (waitForReplicas !== undefined) refuseUnknown('waitForReplicas', waitForReplicas, ['replicas', 'timeout']);
    const ca = tlsCa(tls);
    const id = answer(
      native.createRedisAdapter({
        urls: list,
        cluster,
        connectTimeout: optionalMs('connectTimeout', options.connectTimeout),
        commandTimeout: optionalMs('commandTimeout', options.commandTimeout),
        waitForReplicas: waitForReplicas && {
          replicas: optionalMs('waitForReplicas.replicas', waitForReplicas.replicas),
          timeout: optionalMs('waitForReplicas.timeout', waitForReplicas.timeout),
        },
        tlsCa: ca,
      }),
    );
    bindNative(this, id);
    // Connects now rather than on first use. A maxmemory-policy warning found at connect is
    // emitted by the engine before any answer over the connection (so before the first grant).
    const opId = nextOpId();
    try {
      const r = answer(native.redisConnect(id, opId), opId);
      if (r instanceof Promise) r.catch(() => {}); // a failed connect is reported by the operations that need it
    } catch {
      // Likewise.
    }
  }

  /** Closes the connections. Operations afterwards fail with a BackendError. */
  async close() {
    native.closeAdapter(this[NATIVE_ID]);
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }
}

module.exports = { RedisAdapter };
