// Samples of `perf script` sorted into areas of a Node process, and perch set against the plain
// bound per hit (profile-side.mjs).

/**
 * The area a sample's symbol belongs to. JIT frames are named by `--perf-basic-prof`
 * (`JS:*name file:line`, `RegExp:...`); everything else by the binary it is in.
 */
export function areaOf(sym, dso) {
  if (dso.startsWith('[kernel')) return 'kernel';
  if (sym.startsWith('RegExp:')) return 'regexps (compiled)';
  if (sym.startsWith('JS:') || dso.startsWith('[JIT]') || dso.startsWith('/tmp/perf-')) {
    if (sym.includes('/dist/src/')) return "perch's own functions";
    if (sym.includes('/node_modules/')) return 'npm packages';
    if (sym.includes('/bench/')) return "the bound's own functions";
    if (sym.includes(' node:')) return "node's own JavaScript";
    return 'other JIT code';
  }
  if (sym.startsWith('Builtins_')) return 'V8 builtins';
  if (sym.startsWith('llhttp') || sym.includes('Parser')) return 'HTTP parser';
  if (/Scaveng|Marking|Mark[A-Z]|Sweep|Evacuat|GCTracer|Heap::/.test(sym)) return 'V8 GC';
  if (dso.endsWith('/node')) return 'node and V8 C++';
  return `other: ${dso.split('/').pop()}`;
}

/**
 * `counts`: { bound, perch }, each a Map from `area\tsymbol` to samples; `rps`: their hits/s
 * over the recording. Since both shared one CPU for the same time, samples / rps is CPU per hit;
 * every figure is a share of the bound's. Areas and symbols sorted by perch's excess, largest first.
 */
export function perchMinusBound(counts, rps) {
  const total = (m) => [...m.values()].reduce((a, b) => a + b, 0);
  const samples = { bound: total(counts.bound), perch: total(counts.perch) };
  const perHit = samples.bound / rps.bound;
  const share = (n, side) => n / rps[side] / perHit;
  const sum = (by) => {
    const out = new Map();
    for (const side of ['bound', 'perch']) {
      for (const [key, n] of counts[side]) {
        const name = by(key);
        const entry = out.get(name) ?? { name, bound: 0, perch: 0 };
        entry[side] += share(n, side);
        out.set(name, entry);
      }
    }
    return [...out.values()].map((e) => ({ ...e, diff: e.perch - e.bound })).sort((a, b) => b.diff - a.diff);
  };
  return {
    samples,
    ratio: share(samples.perch, 'perch'),
    areas: sum((key) => key.split('\t')[0]),
    symbols: sum((key) => key.split('\t')[1]),
  };
}

/**
 * A `--perf-basic-prof` map (`start size name` per line, hex) with only the newest entry for any
 * address: V8 reuses the addresses of code it frees, the map keeps every entry, and perf names a
 * sample after the first that covers it, so start-up code (a schema compiler, a module's top
 * level) would take the samples of hot code compiled later at the same place. Entries overlapped
 * by a later one are dropped.
 */
export function newestPerfMap(text) {
  const entries = text
    .split('\n')
    .map((line) => /^([0-9a-f]+) ([0-9a-f]+) (.*)$/i.exec(line))
    .filter((m) => m !== null)
    .map((m) => ({ start: BigInt(`0x${m[1]}`), end: BigInt(`0x${m[1]}`) + BigInt(`0x${m[2]}`), line: m[0] }));
  const kept = []; // sorted by start, none overlapping
  const firstEndingAfter = (start) => {
    let lo = 0;
    let hi = kept.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (kept[mid].end <= start) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  for (let i = entries.length - 1; i >= 0; i--) {
    const e = entries[i];
    const at = firstEndingAfter(e.start);
    if (at < kept.length && kept[at].start < e.end) continue;
    kept.splice(at, 0, e);
  }
  return kept.map((e) => `${e.line}\n`).join('');
}
