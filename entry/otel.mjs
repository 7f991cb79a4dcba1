import cjs from './otel.js';

export const { lockMetrics } = cjs;
