/** How a call of a split went, as the search reads it. */
export type SplitOutcome =
  /** The provider refused it whole: a 400 on the batch, or on the single lookup of its one item. */
  | 'refused'
  /** The provider answered its items. */
  | 'answered'
  /** It failed as a whole otherwise (5xx, timeout, 429) or was never made: it says nothing of its items. */
  | 'failed';

/**
 * The search for the items at fault in a batch call the provider refused whole (X answers 400 to
 * a batch for one item it cannot take), one call at a time. Every item is answered by a call that
 * carried it, never by inference: the search only chooses which items the next call carries.
 *
 * The set refused is known to hold an item at fault. Its first half is asked: refused, the fault
 * is in it, and the other half is set aside, unknown; answered, the fault is in the other half,
 * which is halved in turn without being asked. A set of one is asked alone, as the single lookup,
 * and gets that lookup's answer. Once the item at fault is answered, the items set aside are asked
 * again together, and a refusal starts the same search on them. Each item at fault of a batch of
 * `n` therefore costs at most `ceil(log2(n)) + 2` calls (the halvings, the last item alone, the
 * set-aside items asked again), so a batch with `k` items at fault costs at most
 * `k * (ceil(log2(n)) + 2) + 1` calls with the refused one (`n = 100`: 10 for one, 28 for three),
 * where halving both halves at once costs up to `2 * k * ceil(log2(n)) + 1` (43 for three).
 *
 * A set refused whole whose items are each answered alone holds no item at fault: the provider
 * refuses calls of this form, not items (X refusing every batch call, and serving single
 * lookups). The search then ends, its items not yet asked are `unasked` (the batch layer asks
 * them alone, as without batching), and `formRefused` says so. The provider answering a call of
 * two or more of the search first (`proven`) rules that out.
 */
export class BatchSplit<T> {
  /** Items thought to hold one at fault. */
  #suspects: readonly T[];
  /** Whether `#suspects` is known to hold one: refused, or left of a refused set whose other items were answered. */
  #known = true;
  /** Items set aside while halving, not known either way: asked again together. */
  #aside: T[] = [];
  /** The call under way: its items, and the half not asked when it is the first half of the suspects. */
  #asking: { readonly items: readonly T[]; readonly rest?: readonly T[]; readonly suspect: boolean } | undefined;
  #proven = false;
  #formRefused = false;

  /** Every item of the batch refused. */
  readonly items: readonly T[];

  /** `refused`: the items of a call of two or more the provider refused whole. */
  constructor(refused: readonly T[]) {
    this.items = refused;
    this.#suspects = refused;
  }

  /**
   * Whether a call of two or more items of this split was answered: the provider serves calls of
   * this form, so a later refusal is about the items it carries, not the provider refusing every
   * call. A single lookup answered is not one: it is another form.
   */
  get proven(): boolean {
    return this.#proven;
  }

  /** Whether the search found the provider refusing calls of this form, not items (the class's comment). */
  get formRefused(): boolean {
    return this.#formRefused;
  }

  /** The items no call has yet answered for themselves: once the form is refused, to be asked alone. */
  get unasked(): readonly T[] {
    return [...this.#suspects, ...this.#aside];
  }

  /** The items of the next call; undefined once every item has been asked for its own answer, or the form is refused. */
  next(): readonly T[] | undefined {
    if (this.#formRefused) {
      this.#asking = undefined;
    } else if (this.#suspects.length >= 2) {
      const half = Math.ceil(this.#suspects.length / 2);
      this.#asking = { items: this.#suspects.slice(0, half), rest: this.#suspects.slice(half), suspect: true };
    } else if (this.#suspects.length === 1) {
      this.#asking = { items: this.#suspects, suspect: true };
    } else if (this.#aside.length > 0) {
      this.#asking = { items: this.#aside, suspect: false };
      this.#aside = [];
    } else {
      this.#asking = undefined;
    }
    return this.#asking?.items;
  }

  /** How the call `next` chose went. */
  settled(outcome: SplitOutcome): void {
    const asking = this.#asking;
    if (asking === undefined) throw new Error('BatchSplit.settled without a call under way');
    this.#asking = undefined;
    if (outcome === 'answered' && asking.items.length > 1) this.#proven = true;
    if (asking.rest === undefined) {
      // The last suspect answered alone, in a set known to hold one at fault whose other items
      // were answered too: the refusal was of the form, not of an item.
      if (asking.suspect && outcome === 'answered' && this.#known && !this.#proven) this.#formRefused = true;
      // A set asked alone (the last suspect, or the items set aside): a refusal of two or more
      // makes them the suspects; one item got its own answer.
      this.#suspects = outcome === 'refused' && asking.items.length > 1 ? asking.items : [];
      this.#known = true;
    } else if (outcome === 'refused') {
      this.#aside.push(...asking.rest);
      // One item refused alone is the one at fault, answered.
      this.#suspects = asking.items.length > 1 ? asking.items : [];
      this.#known = true;
    } else {
      // The first half did not hold it (or said nothing): the rest is searched without asking it
      // whole, known to hold it only if the first half was answered.
      this.#suspects = asking.rest;
      this.#known &&= outcome === 'answered';
    }
  }
}
