'use strict';
// locco-rs/testing: the contract suite every adapter passes. Under node:test it registers
// with node:test; under vitest, import locco-rs/testing as ESM (it finds vitest itself) or
// pass { describe, it, beforeEach, afterEach }.

const { registerContract } = require('./lib/contract.js');

/**
 * Registers the adapter contract suite.
 * @param {string} name
 * @param {() => ({ adapter, cleanup? } | Promise<{ adapter, cleanup? }>)} factory
 * @param {{ describe, it, beforeEach, afterEach }} [runner]
 */
function runLockAdapterContract(name, factory, runner) {
  registerContract(name, factory, runner ?? require('node:test'));
}

module.exports = { runLockAdapterContract };
