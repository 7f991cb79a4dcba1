'use strict';
// locco-rs/testing: the contract suite every adapter passes. Under node:test it registers
// with node:test; under vitest, import locco-rs/testing as ESM (it finds vitest itself) or
// pass { describe, it, beforeEach, afterEach }. And chaosAdapter, which wraps an adapter to
// make its calls fail from a seed.

const { registerContract } = require('../lib/contract.js');
const { chaosAdapter, ChaosError, CHAOS_FAULTS, DEFAULT_CHAOS_RATES } = require('../lib/chaos.js');

/**
 * Registers the adapter contract suite.
 * @param {string} name
 * @param {() => ({ adapter, cleanup? } | Promise<{ adapter, cleanup? }>)} factory
 * @param {{ describe, it, beforeEach, afterEach }} [runner]
 */
function runLockAdapterContract(name, factory, runner) {
  registerContract(name, factory, runner ?? require('node:test'));
}

module.exports = { runLockAdapterContract, chaosAdapter, ChaosError, CHAOS_FAULTS, DEFAULT_CHAOS_RATES };
