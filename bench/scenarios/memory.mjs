// Memory: RSS of a perch process after filling its cache with `entries` distinct ~1.5 KB user
// bodies, against cache.memory.max_bytes (set so the entries exceed it: perch charges each entry
// body + 2 x key + 256 bytes, about 1.85 KB here, so 100k entries are ~185 MB against 128 MiB).
import { BENCH_KEY, get, startPerch } from '../lib/perch.mjs';
import { issueAll } from '../lib/load.mjs';
import { memoryOf, sleep } from '../lib/procs.mjs';
import { startUpstream } from '../lib/servers.mjs';

const MB = 1024 * 1024;

export async function memoryScenario(ctx) {
  const { options } = ctx;
  const m = options.memory;
  const notes = [];
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const rss = [];
    const peaks = [];
    let startRss;
    for (let r = 0; r < options.runs; r++) {
      // user_by_username TTL 0: perch would otherwise also store each user under its username
      // (cross-population), and the figure is defined for `entries` entries, not twice that.
      const perch = await startPerch(ctx, 'perch-memory', { upstreamUrl: upstream.url, ttl: { user: 3600, user_by_username: 0 }, maxBytes: m.maxBytes });
      try {
        startRss = memoryOf(perch.proc.pid).rss;
        const result = await issueAll({
          targets: [perch.url],
          count: m.entries,
          pathOf: (i) => `/v1/users/${3_000_000_000_000_000_000n + BigInt(i)}`,
          headers: { 'x-api-key': BENCH_KEY },
          concurrency: options.connections,
          deadlineMs: m.deadlineS * 1000,
        });
        if (!result.completed || result.ok !== m.entries) {
          throw new Error(`memory fill: ${result.ok} of ${m.entries} answered 200 (${JSON.stringify(result.statuses)}, ${result.errors} errors${result.firstError ? `: ${result.firstError}` : ''})`);
        }
        const last = await get(perch.url, `/v1/users/${3_000_000_000_000_000_000n + BigInt(m.entries - 1)}`);
        if (!String(last.headers['cache-status']).startsWith('perch; hit')) throw new Error('memory fill: the last entry is not cached');
        await sleep(1000); // let in-flight work and deferred frees settle
        const mem = memoryOf(perch.proc.pid);
        rss.push(mem.rss);
        peaks.push(mem.peak);
        ctx.log(`  memory run ${r + 1}: ${m.entries} entries in ${result.seconds.toFixed(1)} s, RSS ${(mem.rss / MB).toFixed(1)} MiB (peak ${(mem.peak / MB).toFixed(1)} MiB), start ${(startRss / MB).toFixed(1)} MiB`);
      } finally {
        await perch.proc.stop();
      }
    }
    const target = 1.3 * m.maxBytes + 80 * MB;
    notes.push(
      `Memory: ${m.entries} distinct ~1.5 KB entries (about ${((m.entries * 1850) / MB).toFixed(0)} MiB as perch charges them) into max_bytes ${(m.maxBytes / MB).toFixed(0)} MiB; RSS read from /proc 1 s after the fill; RSS right after start ${(startRss / MB).toFixed(1)} MiB; target 1.3 x max_bytes + 80 MiB = ${(target / MB).toFixed(1)} MiB.`,
    );
    return {
      figures: [
        {
          id: 'memory.rss',
          label: `RSS after ${m.entries} entries (MiB)`,
          runs: rss.map((b) => b / MB),
          baseline: { label: 'max_bytes', value: m.maxBytes / MB },
          target: { text: `<= 1.3 x max_bytes + 80 MiB (${(target / MB).toFixed(0)})`, pass: (v) => v * MB <= target },
          decimals: 1,
        },
        { id: 'memory.peak', label: 'peak RSS during the fill (MiB)', runs: peaks.map((b) => b / MB), baseline: { label: 'max_bytes', value: m.maxBytes / MB }, decimals: 1 },
      ],
      notes,
    };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
}
