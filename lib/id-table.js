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
 * dictionary whose adds and deletes cost a twelfth of a contended in-memory hand-off.
 *
 * Ids are handed out in order and operations end roughly in the order they began, so the live
 * ids of a moment are a run of consecutive numbers: each has a slot of its own (`id & mask`),
 * and a delete just empties it. An id whose slot is taken (an older one still live, a
 * capacity's worth of ids earlier) goes to a small Map beside the arrays. The arrays double
 * when they are half full, so a run of live ids keeps fitting. (Probing with deletion markers,
 * as before, had to rebuild the arrays every few dozen operations: 4% of a contended hand-off.)
 */
const EMPTY = 0;
const FIRST_CAPACITY = 64;

class IdTable {
  constructor() {
    this.size = 0;
    this._overflow = new Map();
    this._alloc(FIRST_CAPACITY);
  }

  _alloc(capacity) {
    this._mask = capacity - 1;
    this._ids = new Array(capacity).fill(EMPTY);
    this._values = new Array(capacity).fill(undefined);
  }

  get(id) {
    const i = id & this._mask;
    if (this._ids[i] === id) return this._values[i];
    return this._overflow.size === 0 ? undefined : this._overflow.get(id);
  }

  /** `value` must not be undefined. */
  set(id, value) {
    const i = id & this._mask;
    const at = this._ids[i];
    if (at === id) {
      this._values[i] = value;
      return;
    }
    const overflow = this._overflow;
    if (overflow.size > 0 && overflow.has(id)) {
      overflow.set(id, value);
      return;
    }
    if (at === EMPTY) {
      this._ids[i] = id;
      this._values[i] = value;
    } else {
      overflow.set(id, value);
    }
    this.size++;
    if (this.size * 2 > this._mask + 1) this._grow();
  }

  delete(id) {
    const i = id & this._mask;
    if (this._ids[i] === id) {
      this._ids[i] = EMPTY;
      this._values[i] = undefined;
      this.size--;
      return true;
    }
    if (this._overflow.size === 0 || !this._overflow.delete(id)) return false;
    this.size--;
    return true;
  }

  /** Twice the room, every entry placed again (those of the overflow too, where they fit now). */
  _grow() {
    const ids = this._ids;
    const values = this._values;
    const overflow = this._overflow;
    this._alloc(ids.length * 2);
    this._overflow = new Map();
    const place = (id, value) => {
      const i = id & this._mask;
      if (this._ids[i] === EMPTY) {
        this._ids[i] = id;
        this._values[i] = value;
      } else this._overflow.set(id, value);
    };
    for (let j = 0; j < ids.length; j++) if (ids[j] !== EMPTY) place(ids[j], values[j]);
    for (const [id, value] of overflow) place(id, value);
    // The old arrays may sit in the old generation: holding values there would keep them alive
    // through the young collections until the next full one.
    values.fill(undefined);
  }
}

module.exports = { IdTable };
