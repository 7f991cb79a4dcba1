// Types of the ESM entry (testing.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './testing.js';
