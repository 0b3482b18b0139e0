// The search for the items at fault in a batch X refused whole (batch-split.ts): which calls it
// makes, how many, and that every item gets exactly one answer of its own. Over real HTTP in
// batch.test.ts; here the search alone, against every placement of the items at fault.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { BatchSplit, type SplitOutcome } from '../src/upstream/batch-split.js';

interface Run {
  /** The calls made, the refused batch first. */
  readonly calls: (readonly number[])[];
  /** For each item, how many calls gave it an answer of its own. */
  readonly answers: number[];
  /**
   * The most failures in a row the breaker counts (verdict.ts): a refusal of two or more before
   * the split is proven, and an item at fault asked alone (its single lookup's 400).
   */
  readonly failuresInARow: number;
  /** Whether the search found the form refused; its items not yet asked are then each asked alone (calls and answers included). */
  readonly formRefused: boolean;
}

/** Items 0..n-1, refused whole in a first call, searched with `outcome` deciding each call (default: refused while it carries an item at fault). */
function search(n: number, atFault: ReadonlySet<number>, outcome?: (items: readonly number[]) => SplitOutcome): Run {
  const items = Array.from({ length: n }, (_, i) => i);
  const calls: (readonly number[])[] = [items];
  const answers = items.map(() => 0);
  const split = new BatchSplit(items);
  let inARow = 1;
  let failuresInARow = 1;
  for (let part = split.next(); part !== undefined; part = split.next()) {
    calls.push(part);
    const said = outcome?.(part) ?? (part.some((i) => atFault.has(i)) ? 'refused' : 'answered');
    // A call answers its items unless it is a refusal of two or more: one item refused alone has the single lookup's answer.
    if (said !== 'refused' || part.length === 1) for (const i of part) answers[i]!++;
    if (said === 'refused' && (part.length === 1 || !split.proven)) failuresInARow = Math.max(failuresInARow, ++inARow);
    else if (said !== 'failed') inARow = 0;
    split.settled(said);
  }
  if (split.formRefused) {
    for (const i of split.unasked) {
      calls.push([i]);
      answers[i]!++;
    }
  }
  return { calls, answers, failuresInARow, formRefused: split.formRefused };
}

/** The bound docs/upstreams.md states: k items at fault among n cost at most k * (ceil(log2 n) + 2) + 1 calls. */
const bound = (n: number, k: number) => k * (Math.ceil(Math.log2(n)) + 2) + 1;

function* placements(n: number, k: number, from = 0): Generator<number[]> {
  if (k === 0) {
    yield [];
    return;
  }
  for (let i = from; i <= n - k; i++) for (const rest of placements(n, k - 1, i + 1)) yield [i, ...rest];
}

test('one item at fault among 100: halves asked one at a time, the others asked again together', { timeout: 10_000 }, () => {
  const { calls, answers } = search(100, new Set([50]));
  assert.deepEqual(
    calls.map((c) => [c[0], c.length]),
    [
      [0, 100],
      // Not in the first half: the second is halved without being asked whole.
      [0, 50],
      [50, 25],
      [50, 13],
      [50, 7],
      [50, 4],
      [50, 2],
      [50, 1],
      // The items set aside on the way (75-99, 63-74, ..., 51), asked again as one call.
      [75, 49],
    ],
  );
  assert.deepEqual(answers, Array.from({ length: 100 }, () => 1));
});

test('the worst placement of k items at fault among n meets the stated bound exactly', { timeout: 60_000 }, () => {
  /** The most calls, and the most failures in a row, over every placement. */
  const worst = (n: number, k: number) => {
    let calls = 0;
    let inARow = 0;
    for (const p of placements(n, k)) {
      const run = search(n, new Set(p));
      calls = Math.max(calls, run.calls.length);
      inARow = Math.max(inARow, run.failuresInARow);
    }
    return { calls, inARow };
  };
  const among100 = [1, 2, 3].map((k) => worst(100, k));
  assert.deepEqual(
    among100.map((w) => w.calls),
    [10, 19, 28],
  );
  assert.deepEqual([bound(100, 1), bound(100, 2), bound(100, 3)], [10, 19, 28]);
  // What docs/upstreams.md says of the breaker: the most failures in a row among 100.
  assert.deepEqual(
    among100.map((w) => w.inARow),
    [8, 16, 24],
  );
  for (let n = 2; n < 100; n++) {
    for (const k of [1, 2]) {
      const { calls } = worst(n, k);
      assert.ok(calls <= bound(n, k), `n ${n}, k ${k}: ${calls} calls, over ${bound(n, k)}`);
    }
  }
});

test('any batch, any items at fault, any failures: each item gets exactly one answer, within the bound when nothing fails', { timeout: 60_000 }, () => {
  fc.assert(
    fc.property(
      fc.integer({ min: 2, max: 100 }).chain((n) => fc.tuple(fc.constant(n), fc.uniqueArray(fc.nat(n - 1), { minLength: 1, maxLength: n }), fc.array(fc.boolean(), { maxLength: 40 }))),
      ([n, faulty, fails]) => {
        const atFault = new Set(faulty);
        // Some calls fail as a whole (a 5xx, a timeout, a refusal before the wire): they say nothing of their items.
        let call = 0;
        const failing = (items: readonly number[]): SplitOutcome => (fails[call++] === true ? 'failed' : items.some((i) => atFault.has(i)) ? 'refused' : 'answered');
        assert.deepEqual(search(n, atFault, failing).answers, Array.from({ length: n }, () => 1));
        const clean = search(n, atFault);
        assert.deepEqual(clean.answers, Array.from({ length: n }, () => 1));
        assert.ok(clean.calls.length <= bound(n, atFault.size), `${clean.calls.length} calls for ${atFault.size} at fault among ${n}`);
      },
    ),
    { numRuns: 300, seed: 59 },
  );
});

test('the split is proven once a call of two or more of it is answered, not by a single lookup nor a failure', { timeout: 10_000 }, () => {
  const split = new BatchSplit([1, 2, 3, 4]);
  assert.equal(split.proven, false);
  assert.deepEqual(split.next(), [1, 2]);
  split.settled('refused');
  assert.deepEqual(split.next(), [1]);
  split.settled('failed');
  assert.equal(split.proven, false);
  assert.deepEqual(split.next(), [2]);
  split.settled('answered');
  // A single lookup is another form of call: its answer proves nothing of batch calls.
  assert.equal(split.proven, false);
  // 1 said nothing: 2 answered alone does not clear [1, 2], and the search goes on.
  assert.equal(split.formRefused, false);
  // The half set aside when [1, 2] was refused.
  assert.deepEqual(split.next(), [3, 4]);
  split.settled('answered');
  assert.equal(split.proven, true);
  assert.equal(split.next(), undefined);
  assert.throws(() => split.settled('answered'), /without a call under way/);
});

test('a refused set whose items are each answered alone: the provider refuses the form, and the search ends', { timeout: 10_000 }, () => {
  // X refuses every call of two or more and answers every single lookup.
  const form = (items: readonly number[]): SplitOutcome => (items.length > 1 ? 'refused' : 'answered');
  const run = search(100, new Set(), form);
  assert.equal(run.formRefused, true);
  assert.deepEqual(
    run.calls.slice(0, 10).map((c) => c.length),
    // The halvings down to a pair, each item of the pair alone; then the 98 others alone.
    [100, 50, 25, 13, 7, 4, 2, 1, 1, 1],
  );
  assert.deepEqual(run.answers, Array.from({ length: 100 }, () => 1));
  // n + ceil(log2 n) calls, the refused one included, against n without batching.
  assert.equal(run.calls.length, 107);
  for (let n = 2; n <= 100; n++) {
    const { calls, answers } = search(n, new Set(), form);
    assert.ok(calls.length <= n + Math.ceil(Math.log2(n)), `n ${n}: ${calls.length} calls`);
    assert.deepEqual(answers, Array.from({ length: n }, () => 1));
  }
  // Once a call of two or more is answered, no refusal is taken for the form's.
  const split = new BatchSplit([1, 2, 3, 4, 5, 6]);
  assert.deepEqual(split.next(), [1, 2, 3]);
  split.settled('answered');
  assert.deepEqual(split.next(), [4, 5]);
  split.settled('refused');
  assert.deepEqual(split.next(), [4]);
  split.settled('answered');
  assert.deepEqual(split.next(), [5]);
  split.settled('answered');
  assert.equal(split.formRefused, false);
  assert.deepEqual(split.next(), [6]);
});

test('any batch, items at fault and failures, X refusing the form or not: each item gets exactly one answer', { timeout: 60_000 }, () => {
  fc.assert(
    fc.property(
      fc.integer({ min: 2, max: 100 }).chain((n) => fc.tuple(fc.constant(n), fc.uniqueArray(fc.nat(n - 1), { maxLength: n }), fc.array(fc.boolean(), { maxLength: 40 }), fc.boolean())),
      ([n, faulty, fails, formRefused]) => {
        // The batch was refused: for its form, or for an item at fault.
        fc.pre(formRefused || faulty.length > 0);
        const atFault = new Set(faulty);
        let call = 0;
        const outcome = (items: readonly number[]): SplitOutcome =>
          fails[call++] === true ? 'failed' : (formRefused && items.length > 1) || items.some((i) => atFault.has(i)) ? 'refused' : 'answered';
        const run = search(n, atFault, outcome);
        assert.deepEqual(run.answers, Array.from({ length: n }, () => 1));
        // Only a provider refusing the form is ever taken for one.
        if (!formRefused) assert.equal(run.formRefused, false);
      },
    ),
    { numRuns: 500, seed: 59 },
  );
});
