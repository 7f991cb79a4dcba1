// Types of the ESM entry (redis.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './redis.js';
