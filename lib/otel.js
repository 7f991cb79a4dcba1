'use strict';
// A Locker's events as OpenTelemetry metrics. @opentelemetry/api is an optional peer
// dependency: it is loaded only when no meter is passed, so an application that passes its own
// meter (or does not use this entry) needs nothing more.

const { validation } = require('./errors.js');
const { refuseUnknown } = require('./options.js');
const { version } = require('../package.json');

const OTEL_API = '@opentelemetry/api';

// Bucket advice for the duration histograms, in seconds: an SDK's default buckets are meant for
// milliseconds and would put every wait under 5 s into one bucket.
const WAIT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const HOLD_BUCKETS = [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600];

/** The global meter of @opentelemetry/api, named for this package. */
function globalMeter() {
  let api;
  try {
    api = require(OTEL_API);
  } catch (error) {
    if (error?.code !== 'MODULE_NOT_FOUND' || !String(error.message).includes(OTEL_API)) throw error;
    throw validation(
      'meter',
      `none was given and ${OTEL_API} is not installed: run npm install ${OTEL_API} (and register an SDK that exports), or pass { meter }`,
    );
  }
  return api.metrics.getMeter('locco-rs', version);
}

/**
 * An onEvent handler for a Locker that records its events on an OpenTelemetry meter (see
 * entry/otel.d.ts for the instruments). `meter`: default the global meter of
 * @opentelemetry/api; `group`: maps a key to a metric attribute with few values (keys such as
 * `order:42` have too many), default the part before the first ':'.
 */
function lockMetrics(options = {}) {
  if (options === null || typeof options !== 'object') throw validation('options', 'must be an object { meter?, group? }');
  refuseUnknown('', options, ['meter', 'group']);
  const { group = (key) => key.split(':')[0] } = options;
  if (typeof group !== 'function') throw validation('group', 'must be a function from a key to a string');
  const meter = options.meter ?? globalMeter();
  if (meter === null || typeof meter !== 'object' || typeof meter.createCounter !== 'function' || typeof meter.createHistogram !== 'function') {
    throw validation('meter', 'must be an OpenTelemetry Meter (with createCounter and createHistogram)');
  }
  const acquired = meter.createCounter('locco.lock.acquired', { description: 'Locks granted' });
  const contended = meter.createCounter('locco.lock.contended', { description: 'Attempts refused because the key was held' });
  const wait = meter.createHistogram('locco.lock.wait.duration', {
    unit: 's',
    description: 'Time from the first attempt to the grant',
    advice: { explicitBucketBoundaries: WAIT_BUCKETS },
  });
  const hold = meter.createHistogram('locco.lock.hold.duration', {
    unit: 's',
    description: 'Time a lock was held, until its release or loss',
    advice: { explicitBucketBoundaries: HOLD_BUCKETS },
  });
  const lost = meter.createCounter('locco.lock.lost', { description: 'Leases lost while held, by reason' });
  const failed = meter.createCounter('locco.backend.errors', {
    description: 'Extensions or releases of a held lock, and attempts of an acquisition that rides them out, that the backend failed',
  });
  return (event) => {
    const attributes = { 'locco.key.group': String(group(event.key)) };
    switch (event.type) {
      case 'acquired':
        acquired.add(1, attributes);
        wait.record(event.waitedMs / 1000, attributes);
        break;
      case 'contended':
        contended.add(1, { ...attributes, 'locco.contended.reason': event.reason });
        break;
      case 'released':
        hold.record(event.heldMs / 1000, { ...attributes, 'locco.lock.outcome': 'released' });
        break;
      case 'lost':
        hold.record(event.heldMs / 1000, { ...attributes, 'locco.lock.outcome': 'lost' });
        lost.add(1, { ...attributes, 'locco.lost.reason': event.reason });
        break;
      case 'extendFailed':
        failed.add(1, { ...attributes, 'locco.operation': 'extend' });
        break;
      case 'releaseFailed':
        failed.add(1, { ...attributes, 'locco.operation': 'release' });
        break;
      case 'backendRetry':
        failed.add(1, { ...attributes, 'locco.operation': 'acquire' });
        break;
      default:
        break; // 'extended': a renewal that worked; counting them says little
    }
  };
}

module.exports = { lockMetrics };
