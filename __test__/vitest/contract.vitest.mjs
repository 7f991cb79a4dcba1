// The same contract suite under vitest, found by locco-rs/testing on its own.
import { runLockAdapterContract } from 'locco-rs/testing';
import { InMemoryAdapter } from 'locco-rs/memory';
import { MapAdapter } from '../support/map-adapter.mjs';

runLockAdapterContract('InMemoryAdapter (vitest)', () => ({ adapter: new InMemoryAdapter() }));
runLockAdapterContract('MapAdapter (vitest)', () => ({ adapter: new MapAdapter() }));
