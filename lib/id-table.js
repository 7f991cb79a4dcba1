'use strict';

/**
 * A table keyed by positive integer ids, for the ones added and deleted on every lock
 * operation.
 *
 * Not a Map or a Set: those rebuild their hash table now and then under steady adding and
 * deleting, and link the old table to the new one. An old table that has reached V8's old
 * generation then keeps every later table, and what they held (promises, locks), alive through
 * the young-generation collections until the next full one. Under Redis W2 half of what was
 * allocated survived so, and each young collection took 25-50 ms instead of under 1 ms.
 *
 * Not a plain object either: its integer keys, sparse because ids only grow, live in a number
 * dictionary whose adds and deletes cost a twelfth of a contended in-memory hand-off. Here the
 * ids sit in two arrays by open addressing (linear probing). Ids are handed out in order, so
 * the live ones of a moment fall into consecutive slots and rarely meet; the arrays are only
 * replaced when they grow, and a deleted slot is cleared, so nothing stays reachable.
 */
class IdTable {
  constructor() {
    this.size = 0;
    this._alloc(64);
  }

  _alloc(capacity) {
    this._mask = capacity - 1;
    this._ids = new Array(capacity).fill(0);
    this._values = new Array(capacity).fill(undefined);
  }

  /** The slot of `id`, or of the empty slot where it would go. */
  _find(id) {
    const ids = this._ids;
    const mask = this._mask;
    let i = id & mask;
    for (;;) {
      const at = ids[i];
      if (at === id || at === 0) return i;
      i = (i + 1) & mask;
    }
  }

  get(id) {
    return this._values[this._find(id)];
  }

  /** `value` must not be undefined. */
  set(id, value) {
    const i = this._find(id);
    if (this._ids[i] === id) {
      this._values[i] = value;
      return;
    }
    this._ids[i] = id;
    this._values[i] = value;
    this.size++;
    // At most half full, so that probes stay short.
    if (this.size * 2 > this._mask + 1) this._grow();
  }

  delete(id) {
    const ids = this._ids;
    const values = this._values;
    const mask = this._mask;
    let hole = this._find(id);
    if (ids[hole] !== id) return false;
    // Backward-shift deletion: later entries of the same run move up into the hole, so that
    // a lookup never stops at an empty slot before the entry it looks for.
    let j = hole;
    for (;;) {
      j = (j + 1) & mask;
      const at = ids[j];
      if (at === 0) break;
      const home = at & mask;
      // `at` may fill the hole unless its home lies cyclically in (hole, j].
      const stays = hole <= j ? hole < home && home <= j : hole < home || home <= j;
      if (!stays) {
        ids[hole] = at;
        values[hole] = values[j];
        hole = j;
      }
    }
    ids[hole] = 0;
    values[hole] = undefined;
    this.size--;
    return true;
  }

  _grow() {
    const ids = this._ids;
    const values = this._values;
    this._alloc((this._mask + 1) * 2);
    for (let i = 0; i < ids.length; i++) {
      if (ids[i] !== 0) {
        const slot = this._find(ids[i]);
        this._ids[slot] = ids[i];
        this._values[slot] = values[i];
      }
    }
  }
}

module.exports = { IdTable };
