// Types of the ESM entry (memory.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './memory.js';
