// Small statistics helpers: exact percentiles over recorded samples and medians across runs.

/** The p-th percentile (0-100) of a sorted numeric array, nearest-rank. */
export function percentile(sorted, p) {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
}

export function median(values) {
  const finite = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  if (finite.length === 0) return NaN;
  const mid = finite.length >> 1;
  return finite.length % 2 === 1 ? finite[mid] : (finite[mid - 1] + finite[mid]) / 2;
}

/** A growable Float64Array: recording a latency must not allocate per sample. */
export class Samples {
  #data = new Float64Array(1 << 16);
  #length = 0;

  push(value) {
    if (this.#length === this.#data.length) {
      const bigger = new Float64Array(this.#data.length * 2);
      bigger.set(this.#data);
      this.#data = bigger;
    }
    this.#data[this.#length++] = value;
  }

  get length() {
    return this.#length;
  }

  sorted() {
    return this.#data.slice(0, this.#length).sort();
  }
}
