// Types of the ESM entry (mongo.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './mongo.js';
