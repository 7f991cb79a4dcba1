import type { LockEvent } from '../index.js';

/**
 * The part of an OpenTelemetry `Meter` that lockMetrics uses. A `Meter` of `@opentelemetry/api`
 * fits it; these types do not need that package installed.
 */
export interface LockMetricsMeter {
  createCounter(
    name: string,
    options?: { description?: string; unit?: string },
  ): { add(value: number, attributes?: Record<string, string>): void };
  createHistogram(
    name: string,
    options?: { description?: string; unit?: string; advice?: { explicitBucketBoundaries?: number[] } },
  ): { record(value: number, attributes?: Record<string, string>): void };
}

export interface LockMetricsOptions {
  /**
   * Where the instruments are made. Default: `metrics.getMeter('locco-rs', version)` of
   * `@opentelemetry/api`, which must then be installed (a ValidationError naming `meter` says so).
   */
  meter?: LockMetricsMeter;
  /**
   * Maps a key to the `locco.key.group` attribute: keys such as `order:42` have too many values
   * to be an attribute. Default: the part before the first ':'.
   */
  group?: (key: string) => string;
}

/**
 * An `onEvent` handler that records a Locker's events as OpenTelemetry metrics, each with the
 * attribute `locco.key.group`:
 * - `locco.lock.acquired` (counter): locks granted;
 * - `locco.lock.contended` (counter): attempts refused because the key was held, by `locco.contended.reason`;
 * - `locco.lock.wait.duration` (histogram, s): from the first attempt to the grant;
 * - `locco.lock.hold.duration` (histogram, s): held until release or loss, by `locco.lock.outcome`;
 * - `locco.lock.lost` (counter): leases lost while held, by `locco.lost.reason`;
 * - `locco.backend.errors` (counter): failed extensions and releases, by `locco.operation`.
 *
 * @example
 * ```ts
 * import { Locker } from 'locco-rs';
 * import { InMemoryAdapter } from 'locco-rs/memory';
 * import { lockMetrics } from 'locco-rs/otel';
 *
 * // The global meter of @opentelemetry/api: register your SDK's MeterProvider first.
 * const locker = new Locker({ adapter: new InMemoryAdapter(), onEvent: lockMetrics() });
 * ```
 */
export declare function lockMetrics(options?: LockMetricsOptions): (event: LockEvent) => void;
