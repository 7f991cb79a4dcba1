'use strict';
// Connection URLs are checked here before the engine sees them, so that a mistake is named by
// the part that is wrong. A message never repeats the user info, which may hold a password, nor
// a parameter's value: only its name.

const { validation } = require('./errors.js');
const { closest } = require('./options.js');

/**
 * The parameters each backend's URL takes: what its driver reads and the adapter leaves as it
 * is. A parameter the adapter sets itself is refused with what to use `instead`, and any other
 * is refused too: it would be ignored without a word. `anyCase`: names are matched whatever
 * their case, as the MongoDB driver does.
 */
const URL_PARAMETERS = {
  redis: {
    label: 'a Redis URL',
    takes: ['db'],
    instead: { protocol: 'which the adapter chooses itself' },
  },
  // tokio-postgres's parameters, with libpq's sslmode values (verify-ca, verify-full).
  postgres: {
    label: 'a PostgreSQL URL',
    takes: [
      'user', 'password', 'dbname', 'host', 'hostaddr', 'port', 'options', 'application_name',
      'sslmode', 'sslnegotiation', 'channel_binding', 'target_session_attrs', 'load_balance_hosts',
      'keepalives', 'keepalives_idle', 'keepalives_interval', 'keepalives_retries', 'tcp_user_timeout',
    ],
    instead: {
      connect_timeout: 'which the connectTimeout option (ms) sets',
      sslrootcert: 'which the tls.ca option (the PEM text) replaces',
    },
  },
  // The MongoDB driver's options, less those it is built without (compression, proxies,
  // OpenSSL's key password) and the timeouts the adapter sets itself. The read preference and
  // write concern are taken, so that an application's URL serves as it is, and overruled for
  // the locks: they are read from the primary and written with the writeConcern option.
  mongo: {
    label: 'a MongoDB URL',
    anyCase: true,
    takes: [
      'appName', 'authMechanism', 'authMechanismProperties', 'authSource', 'directConnection',
      'enableOverloadRetargeting', 'heartbeatFrequencyMS', 'journal', 'loadBalanced', 'localThresholdMS',
      'maxAdaptiveRetries', 'maxConnecting', 'maxIdleTimeMS', 'maxPoolSize', 'maxStalenessSeconds',
      'minPoolSize', 'readConcernLevel', 'readPreference', 'readPreferenceTags', 'replicaSet',
      'retryReads', 'retryWrites', 'serverMonitoringMode', 'socketTimeoutMS', 'srvMaxHosts',
      'srvServiceName', 'ssl', 'tls', 'tlsAllowInvalidCertificates', 'tlsCAFile', 'tlsCertificateKeyFile',
      'tlsInsecure', 'uuidRepresentation', 'w', 'waitQueueTimeoutMS', 'wtimeoutMS',
    ],
    instead: {
      connecttimeoutms: 'which the connectTimeout option (ms) sets, with the server selection timeout',
      serverselectiontimeoutms: 'which the connectTimeout option (ms) sets, with the connect timeout',
    },
  },
  etcd: { label: 'an etcd endpoint', takes: [], instead: {}, none: 'none (auth and tls are options)' },
};

/** Throws naming the first of `names` (a URL's parameters) that `spec` does not take. */
function checkParameters(field, names, spec) {
  const fold = (n) => (spec.anyCase ? n.toLowerCase() : n);
  const takes = new Set(spec.takes.map(fold));
  for (const name of names) {
    if (takes.has(fold(name))) continue;
    const list = spec.takes.length > 0 ? spec.takes.join(', ') : spec.none;
    const instead = spec.instead[fold(name)];
    const guess = spec.takes.length > 0 ? closest(name, spec.takes) : undefined;
    const why = instead ?? `which this adapter does not apply${guess === undefined ? '' : ` (did you mean ${guess}?)`}`;
    throw validation(field, `has parameter ${name}, ${why}; ${spec.label} takes ${list}`);
  }
}

/** The parameter names of a URL's query, decoded. */
function queryNames(url) {
  const at = url.indexOf('?');
  if (at === -1) return [];
  return [...new URLSearchParams(url.slice(at + 1).replace(/#.*$/s, '')).keys()];
}

/**
 * Checks the keys of a key=value connection string (`host=… port=… user=…`, values optionally
 * in single quotes with \\ escapes) against `spec`.
 */
function checkKeyValue(field, text, spec) {
  const names = [];
  const pair = /\s*([^=\s]+)\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S*)/gy;
  let m;
  while ((m = pair.exec(text)) !== null) names.push(m[1]);
  checkParameters(field, names, spec);
}

const SHAPE = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\/(?:[^@/?#]*@)?([^/?#]*)/;

/** One `host[:port]` (or `[v6]:port`) of a URL; throws naming what is wrong with it. */
function checkHost(field, hostPort, allowPort) {
  const m = /^(\[[^\]]*\]|[^:]*)(?::(.*))?$/.exec(hostPort);
  const [, host, port] = m;
  if (host === '' || host === '[]') throw validation(field, 'has no host (expected scheme://host:port/…)');
  if (port === undefined) return;
  if (!allowPort) throw validation(field, `names a port (${port}), which this scheme does not take`);
  if (!/^\d{1,5}$/.test(port) || Number(port) < 1 || Number(port) > 65535) {
    throw validation(field, `has port ${JSON.stringify(port)}, which is not a number from 1 to 65535`);
  }
}

/**
 * Checks `url`'s scheme, hosts and parameters. `schemes`: the accepted schemes; `manyHosts`: a
 * comma-separated host list is allowed; `noPortSchemes`: schemes whose hosts take no port;
 * `parameters`: the backend's entry of URL_PARAMETERS.
 */
function checkUrl(field, url, { schemes, manyHosts = false, noPortSchemes = [], parameters }) {
  if (typeof url !== 'string' || url === '') throw validation(field, `is required: ${schemes[0]}://host:port`);
  if (/^(unix|redis\+unix):/.test(url)) return; // a socket path: nothing here to check
  const m = SHAPE.exec(url);
  if (m === null) throw validation(field, `must start with ${schemes.map((s) => `${s}://`).join(' or ')}`);
  const scheme = m[1].toLowerCase();
  if (!schemes.includes(scheme)) {
    throw validation(field, `has scheme ${JSON.stringify(`${scheme}:`)}; use ${schemes.map((s) => `${s}://`).join(' or ')}`);
  }
  const hosts = m[2].split(',');
  if (hosts.length > 1 && !manyHosts) throw validation(field, 'names several hosts; this adapter takes one (use urls for a cluster)');
  for (const h of hosts) checkHost(field, h, !noPortSchemes.includes(scheme));
  checkParameters(field, queryNames(url), parameters);
}

module.exports = { checkUrl, checkKeyValue, checkParameters, queryNames, URL_PARAMETERS };
