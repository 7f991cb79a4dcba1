// Types of the ESM entry (otel.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './otel.js';
