import cjs from './mongo.js';

export const { MongoAdapter, mongoLocksIndexes } = cjs;
