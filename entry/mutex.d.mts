// Types of the ESM entry (mutex.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './mutex.js';
