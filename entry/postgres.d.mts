// Types of the ESM entry (postgres.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './postgres.js';
