'use strict';

const { native, answer, nextOpId } = require('../native.js');
const { NativeAdapter, NATIVE_ID, bindNative } = require('../adapters.js');
const { validation } = require('../errors.js');
const { refuseUnknown, tlsCa } = require('../options.js');
const { checkKeyValue, checkUrl, URL_PARAMETERS } = require('../url.js');

/**
 * Locks in a PostgreSQL table, or (mode: 'advisory') session-level advisory locks, one pooled
 * connection per held lock. The engine owns the connection pool: pass a URL, not a client.
 */
class PostgresAdapter extends NativeAdapter {
  /**
   * @param {{ url: string, tableName?: string, createTable?: boolean, poolSize?: number,
   *   connectTimeout?: number, tls?: { ca?: string | Buffer }, mode?: 'table' | 'advisory',
   *   keys?: 'hash' | 'integer' }} options
   */
  constructor(options) {
    super();
    if (options === null || typeof options !== 'object') throw validation('options', 'must be an object with a url');
    refuseUnknown('', options, ['url', 'tableName', 'createTable', 'poolSize', 'connectTimeout', 'tls', 'mode', 'keys']);
    const { url, tableName, createTable, poolSize, connectTimeout, tls, mode, keys } = options;
    if (mode !== undefined && mode !== 'table' && mode !== 'advisory') throw validation('mode', "must be 'table' or 'advisory'");
    if (keys !== undefined && keys !== 'hash' && keys !== 'integer') throw validation('keys', "must be 'hash' or 'integer'");
    if (keys !== undefined && mode !== 'advisory') throw validation('keys', "applies only to mode: 'advisory'");
    if (typeof url !== 'string') throw validation('url', 'is required: postgres://user:password@host:port/db');
    const parameters = URL_PARAMETERS.postgres;
    if (url.includes('://')) checkUrl('url', url, { schemes: ['postgres', 'postgresql'], manyHosts: true, parameters });
    else checkKeyValue('url', url, parameters); // host=… port=…: the rest is the driver's to read
    if (tableName !== undefined && typeof tableName !== 'string') throw validation('tableName', 'must be a string');
    if (createTable !== undefined && typeof createTable !== 'boolean') throw validation('createTable', 'must be a boolean');
    for (const [field, v] of [['poolSize', poolSize], ['connectTimeout', connectTimeout]]) {
      if (v !== undefined && typeof v !== 'number') throw validation(field, 'must be a number');
    }
    const ca = tlsCa(tls);
    const id = answer(native.createPostgresAdapter({ url, tableName, createTable, poolSize, connectTimeout, tlsCa: ca, mode, keys }));
    bindNative(this, id);
  }

  /** Deletes rows whose lease ended; answers how many. Run it on a schedule. */
  sweepExpired() {
    try {
      const opId = nextOpId();
      return Promise.resolve(answer(native.postgresSweep(this[NATIVE_ID], opId), opId));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Closes the pool. Operations afterwards fail with a BackendError. */
  async close() {
    native.closeAdapter(this[NATIVE_ID]);
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }
}

/** The statements that create the lock table and its fence sequence, for a migration. */
function postgresLocksDdl(tableName = 'locco_locks') {
  if (typeof tableName !== 'string') throw validation('tableName', 'must be a string');
  return answer(native.postgresDdl(tableName));
}

module.exports = { PostgresAdapter, postgresLocksDdl };
