// A seeded PRNG and a Zipf sampler, so every run (and every machine) draws the same workload.

/** mulberry32: a tiny, fast 32-bit PRNG; plenty for drawing a workload, and fully deterministic. */
export function mulberry32(seed) {
  let a = seed >>> 0;
  return function next() {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * `count` ranks in [0, keys) drawn from Zipf(s): P(rank k) proportional to 1/(k+1)^s. Inverse
 * CDF by binary search over the cumulative weights.
 */
export function zipfSample({ keys, s, count, seed }) {
  const cdf = new Float64Array(keys);
  let total = 0;
  for (let k = 0; k < keys; k++) {
    total += 1 / Math.pow(k + 1, s);
    cdf[k] = total;
  }
  const random = mulberry32(seed);
  const out = new Uint32Array(count);
  for (let i = 0; i < count; i++) {
    const u = random() * total;
    let lo = 0;
    let hi = keys - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid] < u) lo = mid + 1;
      else hi = mid;
    }
    out[i] = lo;
  }
  return out;
}
