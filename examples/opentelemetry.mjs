// A Locker's events as OpenTelemetry metrics: how long callers wait for a lock, how long they
// hold it, how many leases are lost and why, and how often the backend failed under a held lock.
// locco-rs does not depend on OpenTelemetry. When your application has `@opentelemetry/api`
// installed (and registers an SDK that exports), the metrics go to its global meter; when it is
// not installed, a small meter of the same shape prints the measurements instead.
// Run: node examples/opentelemetry.mjs
import { Locker } from 'locco-rs';

/**
 * An onEvent handler that records the Locker's events on `meter` (an OpenTelemetry Meter, or
 * anything with createCounter(name, options).add(n, attributes) and
 * createHistogram(name, options).record(value, attributes)).
 *
 * Keys such as `order:42` have too many distinct values to be a metric attribute, so `group`
 * maps a key to a few: by default the part before the first ':'.
 */
export function lockMetrics(meter, { group = (key) => key.split(':')[0] } = {}) {
  const acquired = meter.createCounter('locco.lock.acquired', { description: 'Locks granted' });
  const contended = meter.createCounter('locco.lock.contended', { description: 'Attempts refused because the key was held' });
  const wait = meter.createHistogram('locco.lock.wait', { unit: 'ms', description: 'Time from the first attempt to the grant' });
  const hold = meter.createHistogram('locco.lock.hold', { unit: 'ms', description: 'Time a lock was held, until release or loss' });
  const lost = meter.createCounter('locco.lock.lost', { description: 'Leases lost while held, by reason' });
  const failed = meter.createCounter('locco.backend.errors', { description: 'Extensions or releases the backend failed' });
  return (event) => {
    const attributes = { 'locco.key.group': group(event.key) };
    switch (event.type) {
      case 'acquired':
        acquired.add(1, attributes);
        wait.record(event.waitedMs, attributes);
        break;
      case 'contended':
        contended.add(1, attributes);
        break;
      case 'released':
        hold.record(event.heldMs, { ...attributes, 'locco.outcome': 'released' });
        break;
      case 'lost':
        hold.record(event.heldMs, { ...attributes, 'locco.outcome': 'lost' });
        lost.add(1, { ...attributes, 'locco.lost.reason': event.reason });
        break;
      case 'extendFailed':
        failed.add(1, { ...attributes, 'locco.operation': 'extend' });
        break;
      case 'releaseFailed':
        failed.add(1, { ...attributes, 'locco.operation': 'release' });
        break;
      default:
        break; // 'extended': a heartbeat that worked, not worth a metric here
    }
  };
}

/** The same shape as an OpenTelemetry Meter; keeps every measurement and prints a summary. */
function printingMeter() {
  const series = new Map();
  const instrument = (name) => (value, attributes = {}) => {
    const labels = Object.entries(attributes)
      .map(([k, v]) => `${k}=${v}`)
      .join(',');
    const id = `${name}{${labels}}`;
    if (!series.has(id)) series.set(id, []);
    series.get(id).push(value);
  };
  return {
    createCounter: (name) => ({ add: instrument(name) }),
    createHistogram: (name) => ({ record: instrument(name) }),
    print() {
      for (const [id, values] of [...series].sort(([a], [b]) => a.localeCompare(b))) {
        const total = values.reduce((a, b) => a + b, 0);
        const shown = id.startsWith('locco.lock.wait') || id.startsWith('locco.lock.hold')
          ? `${values.length} values, max ${Math.round(Math.max(...values))} ms`
          : String(total);
        console.log(`  ${id} ${shown}`);
      }
    },
  };
}

/** OpenTelemetry's global meter if the package is installed, else the printing meter. */
async function chooseMeter() {
  try {
    const { metrics } = await import('@opentelemetry/api');
    return { meter: metrics.getMeter('locco-rs'), name: '@opentelemetry/api (exported by the SDK your app registers)' };
  } catch (error) {
    if (error?.code !== 'ERR_MODULE_NOT_FOUND') throw error;
    const meter = printingMeter();
    return { meter, name: 'a printing meter (@opentelemetry/api is not installed)', print: () => meter.print() };
  }
}

/**
 * A backend in this process whose extend and release can be told to fail, standing in for a
 * network backend having a bad moment (a real one would be RedisAdapter, PostgresAdapter, …).
 */
function flakyAdapter() {
  const keys = new Map();
  const live = (key, token) => keys.get(key)?.token === token && keys.get(key).until > Date.now();
  const adapter = {
    failExtends: false,
    failReleases: 0,
    async acquire({ key, token, ttl }) {
      if ((keys.get(key)?.until ?? 0) > Date.now()) return false;
      keys.set(key, { token, until: Date.now() + ttl });
      return true;
    },
    async release({ key, token }) {
      if (adapter.failReleases > 0) {
        adapter.failReleases--;
        throw new Error('connection reset (simulated)');
      }
      return live(key, token) && keys.delete(key);
    },
    async extend({ key, token, ttl }) {
      if (adapter.failExtends) throw new Error('timed out (simulated)');
      if (!live(key, token)) return false;
      keys.set(key, { token, until: Date.now() + ttl });
      return true;
    },
    async isHeld({ key, token }) {
      return live(key, token);
    },
  };
  return adapter;
}

const { meter, name, print } = await chooseMeter();
console.log(`metrics go to ${name}`);
const adapter = flakyAdapter();
const locker = new Locker({ adapter, onEvent: lockMetrics(meter) });

// A wait: the second caller gets the key when the first lets go, 200 ms later.
const first = await locker.acquire('report:daily', { ttl: 5_000 });
const second = locker.acquire('report:daily', { ttl: 5_000, retry: { retries: 50, delay: 50 } });
setTimeout(() => first.release(), 200);
const next = await second;
await next.release();
console.log('the second caller waited for the first');

// A loss: every extension fails until the lease runs out.
adapter.failExtends = true;
const warm = await locker.acquire('cache:warm', { ttl: 300, autoExtend: { maxHold: 60_000 } });
// The library's timers keep no process alive: this timeout does, and bounds the wait.
await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error('cache:warm was not lost within 10 s')), 10_000);
  warm.signal.addEventListener('abort', () => resolve(clearTimeout(timer)), { once: true });
});
adapter.failExtends = false;
console.log(`cache:warm was lost (${warm.lostReason})`);
await warm.release();

// A failed release, then one that works.
adapter.failReleases = 1;
const daily = await locker.acquire('report:daily', { ttl: 5_000 });
await daily.release().catch((error) => console.log(`release failed: ${error.message}; trying again`));
console.log(`released on the second try: ${await daily.release()}`);

await locker.close();
if (print) {
  console.log('measurements:');
  print();
}
