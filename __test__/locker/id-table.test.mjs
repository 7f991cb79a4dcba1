// The table that keeps pending operations and loss handlers by id, against a Map doing the
// same adds, deletes and lookups.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const { IdTable } = createRequire(import.meta.url)('../../lib/id-table.js');

/** A small deterministic generator, so that a failure replays. */
function lcg(seed) {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function checkAgainstMap(table, model, probe) {
  assert.equal(table.size, model.size);
  for (const [id, value] of model) assert.equal(table.get(id), value, `id ${id}`);
  for (const id of probe) if (!model.has(id)) assert.equal(table.get(id), undefined, `gone ${id}`);
}

test('adds, replaces, finds and deletes as a Map does, across growth and wrap-around', () => {
  for (const seed of [1, 2, 3, 42]) {
    const random = lcg(seed);
    const table = new IdTable();
    const model = new Map();
    let next = 1;
    const seen = [];
    for (let step = 0; step < 20_000; step++) {
      const r = random();
      if (r < 0.45) {
        // Mostly fresh ids in order, as the library hands them out; some far ahead, so that
        // runs of different homes meet and wrap around the end of the arrays.
        const id = random() < 0.9 ? next++ : next + Math.floor(random() * 5000);
        table.set(id, `v${id}`);
        model.set(id, `v${id}`);
        seen.push(id);
      } else if (r < 0.5 && model.size > 0) {
        const id = [...model.keys()][Math.floor(random() * model.size)];
        table.set(id, `again${id}`);
        model.set(id, `again${id}`);
      } else if (seen.length > 0) {
        const id = seen[Math.floor(random() * seen.length)];
        assert.equal(table.delete(id), model.delete(id), `delete ${id}`);
      }
      if (step % 997 === 0) checkAgainstMap(table, model, seen);
    }
    checkAgainstMap(table, model, seen);
    for (const id of [...model.keys()]) assert.equal(table.delete(id), true);
    assert.equal(table.size, 0);
    for (const id of seen) assert.equal(table.get(id), undefined);
  }
});

test('ids that share a slot are all kept, and deleting one leaves the others reachable', () => {
  const table = new IdTable();
  // 64 slots at first: 1, 65, 129 and 193 share slot 1, 63 and 127 the last one.
  const ids = [1, 65, 129, 193, 63, 127];
  ids.forEach((id) => table.set(id, id * 10));
  assert.equal(table.delete(65), true);
  assert.equal(table.delete(65), false);
  for (const id of [1, 129, 193, 63, 127]) assert.equal(table.get(id), id * 10);
  assert.equal(table.get(65), undefined);
  assert.equal(table.size, 5);
});

test('ids past 2^32 are told apart from small ids with the same low bits', () => {
  const table = new IdTable();
  const big = 2 ** 40 + 5;
  table.set(5, 'small');
  table.set(big, 'big');
  assert.equal(table.get(5), 'small');
  assert.equal(table.get(big), 'big');
  assert.equal(table.delete(5), true);
  assert.equal(table.get(big), 'big');
});

test('deleting the oldest of many live ids in order costs about what a Map does', () => {
  // Operations finish roughly in the order they started. Backward-shift deletion scanned the
  // whole run of live ids after the one deleted: every operation in flight, on every delete.
  const LIVE = 20_000;
  const ROUNDS = 40_000;
  const time = (make) => {
    const t = make();
    const started = performance.now();
    let next = 1;
    for (; next <= LIVE; next++) t.set(next, next);
    for (let oldest = 1; oldest <= ROUNDS; oldest++, next++) {
      if (t.get(oldest) !== oldest) throw new Error(`lost ${oldest}`);
      t.delete(oldest);
      t.set(next, next);
    }
    return performance.now() - started;
  };
  const median = (xs) => [...xs].sort((a, b) => a - b)[1];
  const table = median([0, 1, 2].map(() => time(() => new IdTable())));
  const map = median([0, 1, 2].map(() => time(() => new Map())));
  assert.ok(table < map * 10 + 5, `IdTable ${table.toFixed(1)} ms, Map ${map.toFixed(1)} ms`);
});
