import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { registerContract } = require('../lib/contract.js');

export const { chaosAdapter, ChaosError, CHAOS_FAULTS, DEFAULT_CHAOS_RATES } = require('../lib/chaos.js');

// Under vitest (which sets VITEST) the suite registers with vitest, else with node:test.
const detected = process.env.VITEST ? await import('vitest') : await import('node:test');

/** Registers the adapter contract suite (see testing.d.ts). */
export function runLockAdapterContract(name, factory, runner) {
  registerContract(name, factory, runner ?? detected);
}
