import assert from 'node:assert/strict';
import { test } from 'node:test';
import { FairPool } from '../src/upstream/fair-pool.js';
import type { Payer } from '../src/upstream/upstream.js';

const payer = (id: string, weight = 1): Payer => ({ id, weight, label: id });

function takeAll<T>(pool: FairPool<T>): T[] {
  const out: T[] = [];
  for (let item = pool.take(); item !== undefined; item = pool.take()) out.push(item);
  return out;
}

test("a key's two items are taken among the first four, whatever another key queued before them", { timeout: 5000 }, () => {
  const pool = new FairPool<string>();
  for (let i = 0; i < 500; i++) pool.add(payer('crawler'), `c${i}`);
  pool.add(payer('app'), 'a0');
  pool.add(payer('app'), 'a1');
  assert.equal(pool.size, 502);
  const taken = takeAll(pool);
  assert.deepEqual(taken.slice(0, 4), ['c0', 'a0', 'c1', 'a1']);
  assert.equal(taken.length, 502);
  assert.equal(pool.size, 0);
});

test('a key of weight 3 gets three seats for one while both wait', { timeout: 5000 }, () => {
  const pool = new FairPool<string>();
  for (let i = 0; i < 6; i++) pool.add(payer('heavy', 3), `h${i}`);
  for (let i = 0; i < 6; i++) pool.add(payer('light'), `l${i}`);
  assert.deepEqual(takeAll(pool).slice(0, 8), ['h0', 'l0', 'h1', 'h2', 'h3', 'l1', 'h4', 'h5']);
});

test('a key that comes back after its items were taken starts at the current turn, not ahead of those waiting', { timeout: 5000 }, () => {
  const pool = new FairPool<string>();
  pool.add(payer('a'), 'a0');
  pool.add(payer('b'), 'b0');
  pool.add(payer('b'), 'b1');
  assert.deepEqual([pool.take(), pool.take()], ['a0', 'b0']);
  pool.add(payer('a'), 'a1');
  // a's finish (1) and b's start (1) tie: the earlier item goes first.
  assert.deepEqual(takeAll(pool), ['b1', 'a1']);
});

test('an item removed (its wait ran out) is not taken and costs its key no turn; removing one not there says so', { timeout: 5000 }, () => {
  const pool = new FairPool<string>();
  pool.add(payer('a'), 'a0');
  pool.add(payer('a'), 'a1');
  pool.add(payer('b'), 'b0');
  assert.equal(pool.remove(payer('a'), 'a0'), true);
  assert.equal(pool.remove(payer('a'), 'a0'), false);
  assert.equal(pool.remove(payer('z'), 'z0'), false);
  assert.equal(pool.size, 2);
  assert.deepEqual(takeAll(pool), ['a1', 'b0']);
});

test("the last item fair order would take is the newest of the key furthest ahead, and taking it moves no tag", { timeout: 5000 }, () => {
  const pool = new FairPool<string>();
  for (let i = 0; i < 5; i++) pool.add(payer('crawler'), `c${i}`);
  pool.add(payer('app'), 'a0');
  pool.add(payer('app'), 'a1');
  assert.deepEqual([pool.takeLast(), pool.takeLast()], ['c4', 'c3']);
  // c0..c2 at tags 0-2, a0 and a1 at 0 and 1: the crawler's c2 (tag 2) is still furthest ahead.
  assert.equal(pool.takeLast(), 'c2');
  // Now a1 and c1 share tag 1: the newer goes.
  assert.equal(pool.takeLast(), 'a1');
  assert.deepEqual(takeAll(pool), ['c0', 'a0', 'c1']);
  assert.equal(new FairPool<string>().takeLast(), undefined);
});

test('a full pool turns away the item due last: the arriving one, or the newest of the key furthest ahead', { timeout: 5000 }, () => {
  const pool = new FairPool<string>();
  for (let i = 0; i < 3; i++) assert.equal(pool.addBounded(payer('crawler'), `c${i}`, 3), undefined);
  // Another of the crawler's would stand last: it is the one turned away.
  assert.equal(pool.addBounded(payer('crawler'), 'c3', 3), 'c3');
  // The app's first is due before the crawler's third, which makes room.
  assert.equal(pool.addBounded(payer('app'), 'a0', 3), 'c2');
  assert.equal(pool.size, 3);
  assert.deepEqual(takeAll(pool), ['c0', 'a0', 'c1']);
});

test('keys that come and go leave no state behind beyond the bound', { timeout: 5000 }, () => {
  const pool = new FairPool<number>();
  let most = 0;
  for (let i = 0; i < 10_000; i++) {
    pool.add(payer(`k${i}`), i);
    assert.equal(pool.take(), i);
    most = Math.max(most, pool.payers);
  }
  // At most the 64 idle flows the bound keeps with none waiting: the 65th clears them all.
  assert.equal(most, 64);
  assert.equal(pool.payers, 10_000 % 65);
  assert.equal(pool.size, 0);
});
