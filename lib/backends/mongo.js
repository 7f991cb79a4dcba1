'use strict';

const { native, answer } = require('../native.js');
const { NativeAdapter, NATIVE_ID, bindNative } = require('../adapters.js');
const { validation } = require('../errors.js');
const { refuseUnknown } = require('../options.js');
const { checkUrl, URL_PARAMETERS } = require('../url.js');

/**
 * Locks in a MongoDB collection, one document per key. The engine owns the client: pass a URL.
 */
class MongoAdapter extends NativeAdapter {
  /**
   * @param {{ url: string, dbName?: string, collectionName?: string, createIndexes?: boolean,
   *   writeConcern?: { w?: 'majority' | number }, connectTimeout?: number }} options
   */
  constructor(options) {
    super();
    if (options === null || typeof options !== 'object') throw validation('options', 'must be an object with a url');
    refuseUnknown('', options, ['url', 'dbName', 'collectionName', 'createIndexes', 'writeConcern', 'connectTimeout']);
    const { url, dbName, collectionName, createIndexes, writeConcern = { w: 'majority' }, connectTimeout } = options;
    if (typeof url !== 'string') throw validation('url', 'is required: mongodb://host:port/db');
    checkUrl('url', url, {
      schemes: ['mongodb', 'mongodb+srv'],
      manyHosts: true,
      noPortSchemes: ['mongodb+srv'],
      parameters: URL_PARAMETERS.mongo,
    });
    for (const [field, v] of [['dbName', dbName], ['collectionName', collectionName]]) {
      if (v !== undefined && typeof v !== 'string') throw validation(field, 'must be a string');
    }
    if (createIndexes !== undefined && typeof createIndexes !== 'boolean') throw validation('createIndexes', 'must be a boolean');
    if (connectTimeout !== undefined && typeof connectTimeout !== 'number') throw validation('connectTimeout', 'must be a number');
    if (writeConcern === null || typeof writeConcern !== 'object') throw validation('writeConcern', 'must be an object { w }');
    refuseUnknown('writeConcern', writeConcern, ['w']);
    const { w = 'majority' } = writeConcern;
    if (w !== 'majority' && typeof w !== 'number') throw validation('writeConcern.w', "must be 'majority' or a number");
    const id = answer(
      native.createMongoAdapter({ url, dbName, collectionName, createIndexes, w: w === 'majority' ? undefined : w, connectTimeout }),
    );
    bindNative(this, id);
  }

  /** Closes the client. Operations afterwards fail with a BackendError. */
  async close() {
    native.closeAdapter(this[NATIVE_ID]);
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }
}

/** The lock collection's indexes, in the shape collection.createIndexes() takes. */
function mongoLocksIndexes() {
  return JSON.parse(native.mongoIndexes());
}

module.exports = { MongoAdapter, mongoLocksIndexes };
