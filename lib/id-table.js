'use strict';

/**
 * A table keyed by integer ids, for the ones added and deleted on every lock operation.
 *
 * Not a Map or a Set: those rebuild their hash table now and then under steady adding and
 * deleting, and link the old table to the new one. An old table that has reached V8's old
 * generation then keeps every later table, and what they held (promises, locks), alive through
 * the young-generation collections until the next full one. Under Redis W2 half of what was
 * allocated survived so, and each young collection took 25-50 ms instead of under 1 ms. Integer
 * keys of a plain object are its elements, which V8 keeps in a number dictionary once they are
 * sparse (ids only grow); that dictionary rebuilds without such links.
 */
class IdTable {
  constructor() {
    this.size = 0;
    this._byId = Object.create(null);
  }

  get(id) {
    return this._byId[id];
  }

  /** `value` must not be undefined. */
  set(id, value) {
    if (this._byId[id] === undefined) this.size++;
    this._byId[id] = value;
  }

  delete(id) {
    if (this._byId[id] === undefined) return false;
    delete this._byId[id];
    this.size--;
    return true;
  }
}

module.exports = { IdTable };
