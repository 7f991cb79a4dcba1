'use strict';
// adapter.checkSafety(): the engine checks the deployment and judges it; this file only
// passes the options in and parses the findings it answers.

const { native, answer, nextOpId } = require('./native.js');
const { validation } = require('./errors.js');
const { refuseUnknown } = require('./options.js');

/** What a finding's severity means, most severe first. */
const SEVERITIES = ['unsafe', 'warning', 'info'];

/**
 * Checks the deployment behind a built-in adapter; answers its findings, most severe first.
 * @param {number} adapterId
 * @param {{ clockSampleMs?: number }} [options]
 */
async function checkSafety(adapterId, options = {}) {
  if (options === null || typeof options !== 'object') throw validation('options', 'must be an object');
  // holderClockRate is for tests: it reads the holder's clock as this many times the real one.
  refuseUnknown('', options, ['clockSampleMs', 'holderClockRate']);
  const { clockSampleMs, holderClockRate } = options;
  if (clockSampleMs !== undefined && typeof clockSampleMs !== 'number') throw validation('clockSampleMs', 'must be a number of ms');
  if (holderClockRate !== undefined && typeof holderClockRate !== 'number') throw validation('holderClockRate', 'must be a number');
  const opId = nextOpId();
  const text = await answer(native.checkSafety(adapterId, { clockSampleMs, holderClockRate }, opId), opId);
  const findings = JSON.parse(text);
  // Stable: the engine's order within a severity.
  return findings.sort((a, b) => SEVERITIES.indexOf(a.severity) - SEVERITIES.indexOf(b.severity));
}

/** How many findings of each severity. */
function countFindings(findings) {
  const counts = { unsafe: 0, warning: 0, info: 0 };
  for (const f of findings) counts[f.severity] += 1;
  return counts;
}

/** The findings as text for a terminal: one block per finding, then a summary line. */
function formatFindings(findings) {
  const label = { unsafe: 'UNSAFE ', warning: 'WARNING', info: 'info   ' };
  const indent = ' '.repeat(9);
  const blocks = findings.map(
    (f) => `${label[f.severity]}  ${f.id}: ${f.message}\n${indent}why: ${f.why}\n${indent}fix: ${f.fix}`,
  );
  const c = countFindings(findings);
  const verdict =
    c.unsafe > 0
      ? 'this deployment can break the locks: fix the unsafe findings'
      : c.warning > 0
        ? 'no unsafe finding; the warnings weaken a guarantee in some failure'
        : 'no unsafe finding';
  blocks.push(`${c.unsafe} unsafe, ${c.warning} warning${c.warning === 1 ? '' : 's'}, ${c.info} info: ${verdict}`);
  return blocks.join('\n\n');
}

module.exports = { checkSafety, countFindings, formatFindings, SEVERITIES };
