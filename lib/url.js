'use strict';
// Connection URLs are checked here before the engine sees them, so that a mistake is named by
// the part that is wrong. A message never repeats the user info, which may hold a password.

const { validation } = require('./errors.js');

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
 * Checks `url`'s scheme and hosts. `schemes`: the accepted schemes; `manyHosts`: a
 * comma-separated host list is allowed; `noPortSchemes`: schemes whose hosts take no port.
 */
function checkUrl(field, url, { schemes, manyHosts = false, noPortSchemes = [] }) {
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
}

module.exports = { checkUrl };
