'use strict';

const { native, answer } = require('../native.js');
const { NativeAdapter, NATIVE_ID, bindNative } = require('../adapters.js');
const { validation } = require('../errors.js');
const { refuseUnknown } = require('../options.js');
const { checkParameters, queryNames, URL_PARAMETERS } = require('../url.js');

const ENDPOINT = /^(https?:\/\/)?[^/\s:]+(:\d+)$|^(https?:\/\/)?\[[0-9a-fA-F:.]+\](:\d+)$/;

function msOption(field, v, min) {
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min) {
    throw validation(field, `must be a whole number of ms >= ${min}, got ${String(v)}`);
  }
  return v;
}

/**
 * Locks as etcd keys on one session lease per adapter. The engine owns the client: pass the
 * members' endpoints.
 */
class EtcdAdapter extends NativeAdapter {
  /**
   * @param {{ endpoints: string[], auth?: { username: string, password: string }, tls?: { ca?: string },
   *   prefix?: string, sessionTtl?: number, connectTimeout?: number, requestTimeout?: number }} options
   */
  constructor(options) {
    super();
    if (options === null || typeof options !== 'object') throw validation('options', 'must be an object with endpoints');
    refuseUnknown('', options, ['endpoints', 'auth', 'tls', 'prefix', 'sessionTtl', 'connectTimeout', 'requestTimeout']);
    const { endpoints, auth, tls, prefix, sessionTtl, connectTimeout, requestTimeout } = options;
    if (!Array.isArray(endpoints) || endpoints.length === 0) {
      throw validation('endpoints', 'is required: a non-empty array such as ["127.0.0.1:2379"]');
    }
    endpoints.forEach((e, i) => {
      if (typeof e === 'string') checkParameters(`endpoints[${i}]`, queryNames(e), URL_PARAMETERS.etcd);
      if (typeof e !== 'string' || !ENDPOINT.test(e)) {
        throw validation(`endpoints[${i}]`, `must be host:port or http(s)://host:port, got ${JSON.stringify(e)}`);
      }
    });
    let username;
    let password;
    if (auth !== undefined) {
      if (auth === null || typeof auth !== 'object') throw validation('auth', 'must be an object { username, password }');
      refuseUnknown('auth', auth, ['username', 'password']);
      ({ username, password } = auth);
      if (typeof username !== 'string' || username === '') throw validation('auth.username', 'must be a non-empty string');
      if (typeof password !== 'string') throw validation('auth.password', 'must be a string');
    }
    let ca;
    if (tls !== undefined) {
      if (tls === null || typeof tls !== 'object') throw validation('tls', 'must be an object { ca? }');
      refuseUnknown('tls', tls, ['ca']);
      ca = tls.ca;
      if (ca !== undefined && (typeof ca !== 'string' || !ca.includes('-----BEGIN'))) {
        throw validation('tls.ca', 'must be a PEM string (-----BEGIN CERTIFICATE-----…)');
      }
    }
    if (prefix !== undefined && (typeof prefix !== 'string' || prefix === '')) throw validation('prefix', 'must be a non-empty string');
    const id = answer(
      native.createEtcdAdapter({
        endpoints,
        username,
        password,
        ca,
        prefix,
        sessionTtl: msOption('sessionTtl', sessionTtl, 2000),
        connectTimeout: msOption('connectTimeout', connectTimeout, 1),
        requestTimeout: msOption('requestTimeout', requestTimeout, 1),
      }),
    );
    bindNative(this, id);
  }

  /** Ends the session: its lease is revoked, so its keys go at once. Operations afterwards fail. */
  async close() {
    native.closeAdapter(this[NATIVE_ID]);
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }
}

module.exports = { EtcdAdapter };
