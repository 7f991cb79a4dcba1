import { createRequire } from 'node:module';

export const { registerContract: registerContractForTest } = createRequire(import.meta.url)('../../lib/contract.js');
