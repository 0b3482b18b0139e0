/**
 * Two counts over a sliding window of time, kept in `buckets` slices of `windowMs / buckets`:
 * memory and cost stay fixed however many calls a window sees, where a log of timestamps would
 * grow with the traffic. An event counts from its slice until `buckets` slices later, so it
 * leaves the window between `windowMs * (buckets - 1) / buckets` and `windowMs` after it happened.
 */
export class SlidingCounts {
  readonly #width: number;
  readonly #slices: number;
  /** Per slot: the slice index it holds, and its two counts. */
  readonly #index: Float64Array;
  readonly #first: Float64Array;
  readonly #second: Float64Array;

  constructor(windowMs: number, buckets = 10) {
    this.#slices = buckets;
    this.#width = Math.max(1, windowMs / buckets);
    this.#index = new Float64Array(buckets).fill(-Infinity);
    this.#first = new Float64Array(buckets);
    this.#second = new Float64Array(buckets);
  }

  /** Counts one event of the first kind (`which` 0) or the second (`which` 1) at `nowMs`. */
  add(nowMs: number, which: 0 | 1): void {
    const index = Math.floor(nowMs / this.#width);
    const slot = index % this.#slices;
    if (this.#index[slot] !== index) {
      this.#index[slot] = index;
      this.#first[slot] = 0;
      this.#second[slot] = 0;
    }
    if (which === 0) this.#first[slot]! += 1;
    else this.#second[slot]! += 1;
  }

  /** Both counts over the window that ends at `nowMs`. */
  totals(nowMs: number): [first: number, second: number] {
    const current = Math.floor(nowMs / this.#width);
    let first = 0;
    let second = 0;
    for (let slot = 0; slot < this.#slices; slot++) {
      const index = this.#index[slot]!;
      if (index > current - this.#slices && index <= current) {
        first += this.#first[slot]!;
        second += this.#second[slot]!;
      }
    }
    return [first, second];
  }

  clear(): void {
    this.#index.fill(-Infinity);
  }
}
