// A Locker's events as OpenTelemetry metrics through locco-rs/otel: how long callers wait for a
// lock, how long they hold it, how many leases are lost and why, and how often the backend failed
// under a held lock. `lockMetrics()` records on the global meter of `@opentelemetry/api` (an
// optional peer dependency: install it beside locco-rs), which the SDK your application registers
// exports. Here a provider that prints what it is given stands in for that SDK.
// Run: node examples/opentelemetry.mjs
import { metrics } from '@opentelemetry/api';
import { Locker } from 'locco-rs';
import { lockMetrics } from 'locco-rs/otel';

/** A MeterProvider that keeps every measurement and prints a summary; an SDK would export them. */
function printingMeterProvider() {
  const series = new Map();
  const units = new Map();
  const instrument = (name, options) => {
    units.set(name, options?.unit);
    return (value, attributes = {}) => {
      const labels = Object.entries(attributes)
        .map(([k, v]) => `${k}=${v}`)
        .join(',');
      const id = `${name}{${labels}}`;
      if (!series.has(id)) series.set(id, { name, values: [] });
      series.get(id).values.push(value);
    };
  };
  const meter = {
    createCounter: (name, options) => ({ add: instrument(name, options) }),
    createHistogram: (name, options) => ({ record: instrument(name, options) }),
  };
  return {
    getMeter: () => meter,
    print() {
      for (const [id, { name, values }] of [...series].sort(([a], [b]) => a.localeCompare(b))) {
        const shown =
          units.get(name) === 's'
            ? `${values.length} values, max ${Math.max(...values).toFixed(3)} s`
            : String(values.reduce((a, b) => a + b, 0));
        console.log(`  ${id} ${shown}`);
      }
    },
  };
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

const provider = printingMeterProvider();
metrics.setGlobalMeterProvider(provider);
console.log('metrics go to @opentelemetry/api (a printing provider stands in for the SDK)');
const adapter = flakyAdapter();
const locker = new Locker({ adapter, onEvent: lockMetrics() });

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
console.log('measurements:');
provider.print();
