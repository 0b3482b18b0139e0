// Memory: RSS of a perch process after filling its cache with more distinct entries than
// cache.memory.max_bytes holds, for two entry sizes and two heap settings, interleaved round by
// round:
// - ~1.5 KB user entries (`entries`, 100k: perch charges each body, its compressed variants,
//   2 x key and the overheads, so 100k are well over max_bytes) and ~10 KB tweets pages (`pages`,
//   40k: ~3x max_bytes);
// - nothing passed, as a user starts perch (bin/perch, the command `npx perch` and `npm start`
//   run): perch sizes V8's heap from max_bytes itself (src/app/heap-size.ts) before node starts;
//   the whole process tree is measured, which on Node 20 included a launcher when perch was
//   started as node dist/src/main.js (a build without bin/perch still is); and Node's own
//   defaults (`PERCH_HEAP_SIZING=off`), the behaviour before it. The evicted entries are
//   garbage that V8 frees only at its next full GC, and by default it lets the old space grow to
//   a few times what is live before it runs one. The fill rate is reported beside each RSS, as a
//   smaller heap trades CPU (more frequent GCs) for memory.
// BENCH_MEMORY_NODES: node executables to run perch with (comma list; default this one).
import { BENCH_KEY, get, startPerch } from '../lib/perch.mjs';
import { issueAll } from '../lib/load.mjs';
import { execFileSync } from 'node:child_process';
import { memoryOf, processTree, sleep } from '../lib/procs.mjs';
import { startUpstream } from '../lib/servers.mjs';

const MB = 1024 * 1024;
const FIRST_ID = 3_000_000_000_000_000_000n;


export async function memoryScenario(ctx) {
  const { options } = ctx;
  const m = options.memory;
  const sizes = [
    // user_by_username TTL 0: perch would otherwise also store each user under its username
    // (cross-population), and the figure is defined for `entries` entries, not twice that.
    { name: 'users', label: '~1.5 KB user entries', count: m.entries, suffix: '' },
    { name: 'pages', label: '~10 KB tweets pages', count: m.pages, suffix: '/tweets' },
  ];
  const nodes = (process.env.BENCH_MEMORY_NODES ?? process.execPath).split(',').map((path) => ({ path, version: execFileSync(path, ['--version'], { encoding: 'utf8' }).trim() }));
  const settings = nodes.flatMap((node) => [
    { name: `perch-${node.version}`, label: `nothing passed (perch sizes its heap), Node ${node.version}`, node: node.path, env: {}, baseline: `node-${node.version}` },
    { name: `node-${node.version}`, label: `Node's defaults (PERCH_HEAP_SIZING=off), Node ${node.version}`, node: node.path, env: { PERCH_HEAP_SIZING: 'off' } },
  ]);
  const variants = sizes.flatMap((size) => settings.map((setting) => ({ size, setting, rss: [], peaks: [], rates: [], startRss: [] })));
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    for (let r = 0; r < options.runs; r++) {
      for (const v of variants) await fillOnce(ctx, upstream, v, r);
    }
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
  const target = 1.3 * m.maxBytes + 80 * MB;
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const figures = variants.flatMap((v) => {
    const rssFigure = {
      id: `memory.rss.${v.size.name}.${v.setting.name}`,
      label: `RSS after ${v.size.count} ${v.size.label}, ${v.setting.label} (MiB)`,
      runs: v.rss.map((b) => b / MB),
      baseline: { label: 'max_bytes', value: m.maxBytes / MB },
      target: v.setting.baseline === undefined ? undefined : { text: `<= 1.3 x max_bytes + 80 MiB (${(target / MB).toFixed(0)})`, pass: (x) => x * MB <= target },
      decimals: 1,
    };
    if (v.setting.baseline === undefined) return [rssFigure];
    const node = variants.find((d) => d.size === v.size && d.setting.name === v.setting.baseline);
    return [
      rssFigure,
      {
        id: `memory.fill.${v.size.name}.${v.setting.name}`,
        label: `fill rate, ${v.size.label}, ${v.setting.label} (misses/s)`,
        runs: v.rates,
        baseline: { label: "Node's defaults", value: median(node.rates) },
        target: { text: ">= 0.9x Node's defaults", pass: (x) => x >= 0.9 * median(node.rates) },
        decimals: 0,
      },
    ];
  });
  const notes = [
    `Memory: each run fills a new perch (max_bytes ${(m.maxBytes / MB).toFixed(0)} MiB, 64 concurrent requests, every one a miss that is stored) and reads VmRSS from /proc 1 s after the fill; target 1.3 x max_bytes + 80 MiB = ${(target / MB).toFixed(1)} MiB. RSS is the sum over perch's process tree, started as bin/perch (the command npx perch and npm start run; on Node 20 a build without it adds a launcher).`,
    ...variants.map(
      (v) =>
        `${v.size.count} ${v.size.label}, ${v.setting.label}: RSS ${v.rss.map((b) => (b / MB).toFixed(1)).join(' / ')} MiB (peak ${v.peaks.map((b) => (b / MB).toFixed(1)).join(' / ')}; right after start ${v.startRss.map((b) => (b / MB).toFixed(1)).join(' / ')}); fill ${v.rates.map((x) => x.toFixed(0)).join(' / ')} misses/s.`,
    ),
  ];
  return { figures, notes };
}

/** One fill of a new perch for variant `v`; records its RSS, peak and fill rate. */
async function fillOnce(ctx, upstream, v, round) {
  const { options } = ctx;
  const m = options.memory;
  const perch = await startPerch(ctx, `perch-memory-${v.size.name}-${v.setting.name}`, { upstreamUrl: upstream.url, ttl: { user: 3600, user_by_username: 0, tweets: 3600 }, maxBytes: m.maxBytes }, { node: v.setting.node, env: v.setting.env, bin: true });
  try {
    v.startRss.push(treeMemory(perch.proc.pid).rss);
    const pathOf = (i) => `/v1/users/${FIRST_ID + BigInt(i)}${v.size.suffix}`;
    const result = await issueAll({ targets: [perch.url], count: v.size.count, pathOf, headers: { 'x-api-key': BENCH_KEY }, concurrency: options.connections, deadlineMs: m.deadlineS * 1000 });
    if (!result.completed || result.ok !== v.size.count) {
      throw new Error(`memory fill: ${result.ok} of ${v.size.count} answered 200 (${JSON.stringify(result.statuses)}, ${result.errors} errors${result.firstError ? `: ${result.firstError}` : ''})`);
    }
    const last = await get(perch.url, pathOf(v.size.count - 1));
    if (!String(last.headers['cache-status']).startsWith('perch; hit')) throw new Error('memory fill: the last entry is not cached');
    await sleep(1000); // let in-flight work and deferred frees settle
    const mem = treeMemory(perch.proc.pid);
    v.rss.push(mem.rss);
    v.peaks.push(mem.peak);
    v.rates.push(v.size.count / result.seconds);
    ctx.log(`  memory round ${round + 1}, ${v.size.name}, ${v.setting.name}: ${v.size.count} entries in ${result.seconds.toFixed(1)} s, RSS ${(mem.rss / MB).toFixed(1)} MiB (peak ${(mem.peak / MB).toFixed(1)} MiB)`);
  } finally {
    await perch.proc.stop();
  }
}

/** RSS and peak summed over `pid` and the processes below it. */
function treeMemory(pid) {
  const each = processTree(pid).map((p) => memoryOf(p));
  return { rss: each.reduce((a, m) => a + m.rss, 0), peak: each.reduce((a, m) => a + m.peak, 0) };
}
