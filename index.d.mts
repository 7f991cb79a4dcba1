// Types of the ESM entry (index.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './index.js';
