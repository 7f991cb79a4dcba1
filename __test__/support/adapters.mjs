// Every Locker behaviour test runs against each of these adapters.
import { InMemoryAdapter } from 'locco-rs/memory';
import { MapAdapter } from './map-adapter.mjs';

export const ADAPTERS = [
  ['InMemoryAdapter', (opts) => new InMemoryAdapter(opts)],
  ['JavaScript MapAdapter', (opts) => new MapAdapter(opts)],
];

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits until `cond()` is true, polling; fails after `ms`. */
export async function until(cond, ms = 5000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(10);
  }
}
