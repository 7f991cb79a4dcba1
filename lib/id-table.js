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
 * the live ones of a moment fall into consecutive slots and rarely meet.
 *
 * A delete leaves a marker (its value cleared, so nothing stays reachable) rather than moving
 * later entries up: operations end roughly in the order they began, so closing the hole
 * scanned the whole run of live ids after it, every one in flight. The arrays are rebuilt
 * without the markers once live entries and markers fill half of them; a rebuild leaves them
 * at most a quarter full (doubling them when it must, as growth did before), so it is paid for
 * by the quarter's worth of deletes and adds before the next.
 */
const EMPTY = 0;
const DELETED = -1;
const FIRST_CAPACITY = 64;

class IdTable {
  constructor() {
    this.size = 0;
    this._alloc(FIRST_CAPACITY);
  }

  _alloc(capacity) {
    this._mask = capacity - 1;
    this._deleted = 0;
    this._ids = new Array(capacity).fill(EMPTY);
    this._values = new Array(capacity).fill(undefined);
  }

  /** The slot holding `id`, or -1. */
  _find(id) {
    const ids = this._ids;
    const mask = this._mask;
    let i = id & mask;
    for (;;) {
      const at = ids[i];
      if (at === id) return i;
      if (at === EMPTY) return -1;
      i = (i + 1) & mask;
    }
  }

  get(id) {
    const i = this._find(id);
    return i < 0 ? undefined : this._values[i];
  }

  /** `value` must not be undefined. */
  set(id, value) {
    const ids = this._ids;
    const mask = this._mask;
    let i = id & mask;
    let free = -1;
    for (;;) {
      const at = ids[i];
      if (at === id) {
        this._values[i] = value;
        return;
      }
      if (at === EMPTY) break;
      if (at === DELETED && free < 0) free = i;
      i = (i + 1) & mask;
    }
    if (free >= 0) {
      i = free;
      this._deleted--;
    }
    ids[i] = id;
    this._values[i] = value;
    this.size++;
    // At half full, so that the live entries (at most half) fit a quarter of twice the room.
    if ((this.size + this._deleted) * 2 >= mask + 1) this._rebuild();
  }

  delete(id) {
    const i = this._find(id);
    if (i < 0) return false;
    this._ids[i] = DELETED;
    this._values[i] = undefined;
    this.size--;
    this._deleted++;
    return true;
  }

  /** New arrays without the markers, grown until the live entries fill at most a quarter. */
  _rebuild() {
    const ids = this._ids;
    const values = this._values;
    let capacity = ids.length;
    while (this.size * 4 > capacity) capacity *= 2;
    this._alloc(capacity);
    const mask = this._mask;
    for (let j = 0; j < ids.length; j++) {
      const id = ids[j];
      if (id === EMPTY || id === DELETED) continue;
      let i = id & mask;
      while (this._ids[i] !== EMPTY) i = (i + 1) & mask;
      this._ids[i] = id;
      this._values[i] = values[j];
    }
    // The old arrays may sit in the old generation: holding values there would keep them alive
    // through the young collections until the next full one.
    values.fill(undefined);
  }
}

module.exports = { IdTable };
