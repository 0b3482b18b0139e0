#!/usr/bin/env node
// `npm run tracing-instructions` from bench/: instructions per hit under valgrind's callgrind,
// perch with tracing off, at sample_ratio 0 and at 0.01, on the hit scenario's cached page.
// Instructions, not seconds: what else the machine does does not change the count, where one
// wrk run against the next differs by up to a third here. Each perch runs alone under callgrind
// (node's heap sizing off, so there is one process); after WARMUP hits the counters are zeroed,
// HITS more are sent, and the count is dumped. Every thread is counted (V8's background compiler
// and GC included). The count still depends on the process: V8 compiles in the background and
// on its own schedule. Measured here, tracing off read 115.7k-117.6k per hit in four processes,
// but sample_ratio 0 read 118.3k and 132.8k in two and 0.01 122.7k-137.4k in three: run it more
// than once. It says nothing of cache misses or stalls, and work on a timer weighs more per hit
// under valgrind's slowdown, so it complements the wrk figure rather than replacing it.
// BENCH_INSTR_WARMUP (80000), BENCH_INSTR_HITS (10000), BENCH_INSTR_VARIANTS (off,0,0.01).
// Needs valgrind (Debian package valgrind). 13.5 minutes for the three variants here.
import { execFileSync } from 'node:child_process';
import { createServer } from 'node:http';
import { readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';
import { BENCH_KEY, get, perchConfig, startPerchYaml } from './lib/perch.mjs';
import { startUpstream } from './lib/servers.mjs';
import { standaloneContext } from './lib/standalone.mjs';
import { HIT_PATH } from './scenarios/hit.mjs';

const warmup = Number(process.env.BENCH_INSTR_WARMUP ?? 80_000);
const hits = Number(process.env.BENCH_INSTR_HITS ?? 10_000);
const variants = (process.env.BENCH_INSTR_VARIANTS ?? 'off,0,0.01').split(',').map((v) => v.trim());
const CONNECTIONS = 8;

const repoRoot = dirname(dirname(fileURLToPath(import.meta.url)));
const ctx = standaloneContext({ repoRoot, tmpPrefix: 'perch-instructions-' });
const { tmpDir } = ctx;

const sink = createServer((req, res) => req.resume().on('end', () => res.writeHead(200).end()));
await new Promise((resolve) => sink.listen(0, '127.0.0.1', resolve));
const endpoint = `http://127.0.0.1:${sink.address().port}`;
const upstream = await startUpstream(ctx);

/** `count` hits over CONNECTIONS keep-alive connections, each answered before the next is sent. */
async function load(pool, count) {
  let sent = 0;
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (sent++ < count) {
        const res = await pool.request({ path: HIT_PATH, method: 'GET', headers: { 'x-api-key': BENCH_KEY } });
        await res.body.dump();
        if (res.statusCode !== 200) throw new Error(`a hit answered ${res.statusCode}`);
      }
    }),
  );
}

const counts = {};
try {
  for (const variant of variants) {
    const tracing = variant === 'off' ? '' : `tracing: { endpoint: "${endpoint}", sample_ratio: ${Number(variant)} }\n`;
    const out = join(tmpDir, `callgrind.${variant}`);
    const perch = await startPerchYaml(ctx, `perch-instr-${variant}`, (port) => perchConfig({ port, upstreamUrl: upstream.url, ttl: { tweets: 3600 }, metricsYaml: ctx.metricsYaml }) + tracing, {
      node: 'valgrind',
      nodeArgs: ['--tool=callgrind', '--smc-check=all-non-file', `--callgrind-out-file=${out}.%p`, process.execPath],
      env: { PERCH_HEAP_SIZING: 'off' },
      startTimeoutMs: 300_000,
    });
    try {
      await get(perch.url, HIT_PATH);
      const pool = new Pool(perch.url, { connections: CONNECTIONS });
      await load(pool, warmup);
      execFileSync('callgrind_control', ['--zero', String(perch.proc.pid)], { stdio: 'ignore' });
      await load(pool, hits);
      execFileSync('callgrind_control', ['--dump', String(perch.proc.pid)], { stdio: 'ignore' });
      await pool.close();
    } finally {
      await perch.proc.stop();
    }
    // The dump requested above is part 1; the one written at exit (part 0) is the rest.
    const dump = readdirSync(tmpDir).find((f) => f.startsWith(`callgrind.${variant}.`) && f.endsWith('.1'));
    const summary = /^(?:summary|totals): (\d+)/m.exec(readFileSync(join(tmpDir, dump), 'utf8'));
    if (summary === null) throw new Error(`no total in ${dump}`);
    counts[variant] = Number(summary[1]) / hits;
    console.error(`${variant}: ${counts[variant].toFixed(0)} instructions per hit`);
  }
} finally {
  await upstream.proc.stop();
  sink.close();
}

const base = counts.off;
console.log(`instructions per hit under callgrind, after ${warmup} warm-up hits, over ${hits} hits (${CONNECTIONS} connections), Node ${process.version}, ${os.cpus().length} cores:`);
for (const variant of variants) {
  const label = variant === 'off' ? 'tracing off' : `sample_ratio ${variant}`;
  console.log(`  ${label.padEnd(18)} ${counts[variant].toFixed(0).padStart(8)}${base === undefined || variant === 'off' ? '' : `  ${(counts[variant] / base).toFixed(3)}x tracing off`}`);
}
process.exit(0);
