// Self-time summary of a V8 .cpuprofile (as written by `node --cpu-prof`).
import { readFileSync } from 'node:fs';

/**
 * Top `n` functions by self time, plus self time grouped by where the code lives. `window`
 * ({ fromUs, toUs } on the monotonic clock, as process.hrtime: V8 stamps samples with the same
 * clock on Linux) keeps only the samples taken under load, leaving out start-up and shutdown.
 */
export function summarizeProfile(file, n = 10, repoRoot = '', window = undefined) {
  const profile = JSON.parse(readFileSync(file, 'utf8'));
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const parentOf = new Map();
  for (const node of profile.nodes) for (const child of node.children ?? []) parentOf.set(child, node);
  const collect = (from, to) => {
    const self = new Map();
    let t = profile.startTime;
    for (let i = 0; i < profile.samples.length; i++) {
      t += profile.timeDeltas[i] ?? 0;
      if (t < from || t > to) continue;
      const id = profile.samples[i];
      self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0));
    }
    return self;
  };
  let self = window ? collect(window.fromUs, window.toUs) : collect(-Infinity, Infinity);
  const windowed = window !== undefined && self.size > 0;
  if (!windowed) self = collect(-Infinity, Infinity);
  const functions = new Map();
  const areas = new Map();
  let total = 0;
  let idle = 0;
  for (const [id, us] of self) {
    const { functionName, url, lineNumber } = byId.get(id).callFrame;
    const name = functionName || '(anonymous)';
    total += us;
    if (name === '(idle)') idle += us;
    const where = url ? `${shorten(url, repoRoot)}:${lineNumber + 1}` : '';
    // Native functions have no location: name their JS caller instead, which tells writes apart.
    const parent = url ? undefined : parentOf.get(id)?.callFrame;
    const caller = parent && parent.url ? `${parent.functionName || '(anonymous)'} ${shorten(parent.url, repoRoot)}:${parent.lineNumber + 1}` : '';
    const key = `${name} ${where} ${caller}`;
    functions.set(key, { name, where: where || (caller ? `<- ${caller}` : ''), us: (functions.get(key)?.us ?? 0) + us });
    const area = areaOf(name, url);
    areas.set(area, (areas.get(area) ?? 0) + us);
  }
  const busy = total - idle;
  const top = [...functions.values()].filter((f) => f.name !== '(idle)').sort((a, b) => b.us - a.us).slice(0, n);
  return {
    windowed,
    totalMs: total / 1000,
    busyMs: busy / 1000,
    top: top.map((f) => ({ ...f, ms: f.us / 1000, share: f.us / busy })),
    areas: [...areas.entries()].filter(([a]) => a !== 'idle').sort((a, b) => b[1] - a[1]).map(([area, us]) => ({ area, ms: us / 1000, share: us / busy })),
  };
}

function shorten(url, repoRoot) {
  let path = url.replace(/^file:\/\//, '');
  if (repoRoot && path.startsWith(repoRoot)) path = path.slice(repoRoot.length + 1);
  return path.replace(/^.*node_modules\//, 'node_modules/');
}

function areaOf(name, url) {
  if (name === '(idle)') return 'idle';
  if (name === '(garbage collector)') return 'garbage collector';
  if (name === '(program)') return '(program): native, outside JS';
  if (!url) return 'native / builtins';
  if (url.startsWith('node:')) return 'node core (node:*)';
  if (url.includes('/node_modules/')) return `node_modules/${url.split('/node_modules/').pop().split('/')[0]}`;
  if (url.includes('/dist/src/')) return 'perch (dist/src)';
  return 'other';
}
