import cjs from './memory.js';

export const { InMemoryAdapter } = cjs;
