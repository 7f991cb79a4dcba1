// Types of the ESM entry (etcd.mjs): the same names as the CommonJS entry, which it re-exports.
export * from './etcd.js';
