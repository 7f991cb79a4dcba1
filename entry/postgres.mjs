import cjs from './postgres.js';

export const { PostgresAdapter, postgresLocksDdl } = cjs;
