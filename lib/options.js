'use strict';
// Unknown option names are refused: a typo such as `keyprefix` would otherwise drop the
// namespace without a word.

const { validation } = require('./errors.js');

/** Edit distance between two short names, letters compared without case. */
function distance(a, b) {
  a = a.toLowerCase();
  b = b.toLowerCase();
  let row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    row = next;
  }
  return row[b.length];
}

/** The known name closest to `name`, when it is close enough to be a typo. */
function closest(name, known) {
  let best;
  let bestDistance = Infinity;
  for (const k of known) {
    const d = distance(name, k);
    if (d < bestDistance) {
      best = k;
      bestDistance = d;
    }
  }
  return bestDistance <= Math.max(2, Math.floor(best.length / 3)) ? best : undefined;
}

/**
 * Throws a ValidationError naming the first own property of `options` that is not in `known`
 * (`prefix` is the path of `options`, '' at the top), with the closest known name.
 */
function refuseUnknown(prefix, options, known) {
  for (const name in options) {
    if (!Object.prototype.hasOwnProperty.call(options, name) || known.includes(name)) continue;
    const field = prefix === '' ? name : `${prefix}.${name}`;
    const guess = closest(name, known);
    const hint = guess === undefined ? `the known options are ${known.join(', ')}` : `did you mean ${guess}?`;
    throw validation(field, `is not an option here: ${hint}`);
  }
}

/** The PEM text of a `tls: { ca? }` option (a string or a Buffer), or undefined. */
function tlsCa(tls) {
  if (tls === undefined) return undefined;
  if (tls === null || typeof tls !== 'object') throw validation('tls', 'must be an object { ca? }');
  refuseUnknown('tls', tls, ['ca']);
  return tls.ca !== undefined ? String(tls.ca) : undefined;
}

module.exports = { refuseUnknown, closest, tlsCa };
