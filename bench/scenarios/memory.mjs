// Memory: what a perch process holds above its own start once its cache is full, per Node line,
// beside a plain cache on the same line. Each round fills, for every Node line, a new perch with
// perch's defaults (nothing passed: perch sizes its heap and relaunches, src/app/heap-size.ts)
// and a new plain node:http cache (lib/servers/plain-cache.mjs: bodies as Buffers in a Map, Node's
// defaults) with `pages` distinct ~10 KB tweets pages, several times what `max_bytes` holds, at
// `connections` concurrent requests (the undici loop, every request a miss that is stored).
// Read from /proc, summed over the process tree: RSS right after start (after one /healthz
// answer), the plateau (1 s after the fill) and the peak. The target is on what perch holds
// above its own start, so the runtime's own size on each line does not count against perch:
// (plateau - start) <= 1.25 x max_bytes. The fill rate is reported, not judged (the fill is not
// a throughput run).
// BENCH_MEMORY_NODES: node executables to run on (comma list; default this one).
// BENCH_MEMORY_PLAIN=0 leaves the plain cache out (half the time, to compare builds of perch).
import { BENCH_KEY, get, startPerch } from '../lib/perch.mjs';
import { issueAll } from '../lib/load.mjs';
import { execFileSync } from 'node:child_process';
import { memoryOf, processTree, sleep } from '../lib/procs.mjs';
import { startPlainCache, startUpstream } from '../lib/servers.mjs';

const MB = 1024 * 1024;
const FIRST_ID = 3_000_000_000_000_000_000n;
/** The most perch may hold above its start RSS, as a multiple of max_bytes (issue 62). */
const ABOVE_START_SHARE = 1.25;

export async function memoryScenario(ctx) {
  const { options } = ctx;
  const m = options.memory;
  const nodes = (process.env.BENCH_MEMORY_NODES ?? process.execPath).split(',').map((path) => ({ path, version: execFileSync(path, ['--version'], { encoding: 'utf8' }).trim() }));
  const kinds = process.env.BENCH_MEMORY_PLAIN === '0' ? ['perch'] : ['perch', 'plain'];
  const variants = nodes.flatMap((node) => kinds.map((kind) => ({ kind, node, start: [], plateau: [], peak: [], rates: [] })));
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
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const above = (v) => v.plateau.map((p, i) => p - v.start[i]);
  const limit = ABOVE_START_SHARE * m.maxBytes;
  const figures = variants
    .filter((v) => v.kind === 'perch')
    .map((v) => ({
      id: `memory.above-start.pages.${v.node.version}`,
      label: `perch RSS above its start after ${m.pages} ~10 KB pages, Node ${v.node.version} (MiB)`,
      runs: above(v).map((b) => b / MB),
      baseline: { label: 'max_bytes', value: m.maxBytes / MB },
      target: { text: `<= ${ABOVE_START_SHARE} x max_bytes (${(limit / MB).toFixed(0)})`, pass: (x) => x * MB <= limit },
      decimals: 1,
    }));
  const mib = (b) => (b / MB).toFixed(1);
  const table = {
    title: `Memory per Node line: ${m.pages} ~10 KB pages into max_bytes ${mib(m.maxBytes)} MiB, ${m.connections} connections (medians over ${options.runs} rounds, MiB)`,
    head: ['Node', 'perch start', 'perch plateau', 'perch peak', 'above start / max_bytes', 'plain cache start', 'plain cache plateau', 'plain above start / max_bytes'],
    rows: nodes.map((node) => {
      const perch = variants.find((v) => v.kind === 'perch' && v.node === node);
      const plain = variants.find((v) => v.kind === 'plain' && v.node === node) ?? { start: [NaN], plateau: [NaN] };
      return [
        node.version,
        mib(median(perch.start)),
        mib(median(perch.plateau)),
        mib(median(perch.peak)),
        `${(median(above(perch)) / m.maxBytes).toFixed(2)}x`,
        mib(median(plain.start)),
        mib(median(plain.plateau)),
        `${(median(above(plain)) / m.maxBytes).toFixed(2)}x`,
      ];
    }),
  };
  const notes = [
    `Memory: each run fills a new process (max_bytes ${mib(m.maxBytes)} MiB, ${m.connections} concurrent requests, every one a miss that is stored) and reads VmRSS from /proc right after start (one /healthz answered) and 1 s after the fill; target: RSS above start <= ${ABOVE_START_SHARE} x max_bytes = ${mib(limit)} MiB. perch is started as bin/perch with nothing passed (it sizes its heap and relaunches itself in place); the plain cache is bench/lib/servers/plain-cache.mjs on the same node with Node's defaults, holding max_bytes of bodies as Buffers in a Map.`,
    ...variants.map(
      (v) =>
        `${v.kind === 'perch' ? 'perch' : 'plain cache'}, Node ${v.node.version}: start ${v.start.map(mib).join(' / ')} MiB, plateau ${v.plateau.map(mib).join(' / ')} (peak ${v.peak.map(mib).join(' / ')}); fill ${v.rates.map((x) => x.toFixed(0)).join(' / ')} misses/s.`,
    ),
  ];
  return { figures, tables: [table], notes };
}

/** One fill of a new perch or plain cache for variant `v`; records its RSS and fill rate. */
async function fillOnce(ctx, upstream, v, round) {
  const m = ctx.options.memory;
  const server =
    v.kind === 'perch'
      ? await startPerch(ctx, `perch-memory-${round}`, { upstreamUrl: upstream.url, ttl: { user: 3600, user_by_username: 0, tweets: 3600 }, maxBytes: m.maxBytes }, { node: v.node.path, bin: true })
      : await startPlainCache(ctx, upstream.url, m.maxBytes, v.node.path);
  try {
    await get(server.url, '/healthz', { key: null });
    v.start.push(treeMemory(server.proc.pid).rss);
    const pathOf = (i) => `/v1/users/${FIRST_ID + BigInt(i)}/tweets`;
    const result = await issueAll({ targets: [server.url], count: m.pages, pathOf, headers: { 'x-api-key': BENCH_KEY }, concurrency: m.connections, deadlineMs: m.deadlineS * 1000 });
    if (!result.completed || result.ok !== m.pages) {
      throw new Error(`memory fill: ${result.ok} of ${m.pages} answered 200 (${JSON.stringify(result.statuses)}, ${result.errors} errors${result.firstError ? `: ${result.firstError}` : ''})`);
    }
    if (v.kind === 'perch') {
      const last = await get(server.url, pathOf(m.pages - 1));
      if (!String(last.headers['cache-status']).startsWith('perch; hit')) throw new Error('memory fill: the last entry is not cached');
    }
    await sleep(1000); // let in-flight work and deferred frees settle
    const mem = treeMemory(server.proc.pid);
    v.plateau.push(mem.rss);
    v.peak.push(mem.peak);
    v.rates.push(m.pages / result.seconds);
    ctx.log(`  memory round ${round + 1}, ${v.kind}, Node ${v.node.version}: ${m.pages} pages in ${result.seconds.toFixed(1)} s, RSS ${(v.start.at(-1) / MB).toFixed(1)} -> ${(mem.rss / MB).toFixed(1)} MiB (peak ${(mem.peak / MB).toFixed(1)} MiB)`);
  } finally {
    await server.proc.stop();
  }
}

/** RSS and peak summed over `pid` and the processes below it. */
function treeMemory(pid) {
  const each = processTree(pid).map((p) => memoryOf(p));
  return { rss: each.reduce((a, m) => a + m.rss, 0), peak: each.reduce((a, m) => a + m.peak, 0) };
}
