import { createRequire } from 'node:module';

const { registerContract } = createRequire(import.meta.url)('./lib/contract.js');

// Under vitest (which sets VITEST) the suite registers with vitest, else with node:test.
const detected = process.env.VITEST ? await import('vitest') : await import('node:test');

/** Registers the adapter contract suite (see testing.d.ts). */
export function runLockAdapterContract(name, factory, runner) {
  registerContract(name, factory, runner ?? detected);
}
