#!/usr/bin/env node
// `npm run profile-side` from bench/: where perch's CPU per hit goes beyond the plain bound's
// (lib/servers/minimal-path.mjs). Both run side by side on the server CPU, each loaded by its own
// wrk (lib/shared-core.mjs's method), under `perf record -e cpu-clock -C <server CPU>`, both started
// with `--perf-basic-prof` so that JIT frames have names (each map cut to the newest entry per
// address before perf reads it: lib/perf-areas.mjs). Every sample is charged to its process
// (main thread or helper threads) and to an area (V8 builtins, perch's functions, node's
// JavaScript, the kernel...); each area is printed as a share of the bound's CPU per hit, perch
// against the bound, then the symbols that differ most. Needs `perf` (Debian: linux-perf) and the
// right to record the CPU (root, or kernel.perf_event_paranoid <= 0).
// BENCH_DURATION_S (15) recorded, after BENCH_WARMUP_S (20); BENCH_CONNECTIONS (64) per server;
// BENCH_PROFILE_TOP (25) symbols.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BENCH_KEY, startPerch } from './lib/perch.mjs';
import { areaOf, newestPerfMap, perchMinusBound } from './lib/perf-areas.mjs';
import { startMinimalPath, startUpstream } from './lib/servers.mjs';
import { perchRoot, standaloneContext } from './lib/standalone.mjs';
import { wrk } from './lib/wrk.mjs';
import { HIT_PATH, HIT_USER_ID, primeHit } from './scenarios/hit.mjs';

const benchDir = dirname(fileURLToPath(import.meta.url));
const repoRoot = perchRoot();
const durationS = Number(process.env.BENCH_DURATION_S ?? 15);
const warmupS = Number(process.env.BENCH_WARMUP_S ?? 20);
const connections = Number(process.env.BENCH_CONNECTIONS ?? 64);
const topN = Number(process.env.BENCH_PROFILE_TOP ?? 25);

try {
  execFileSync('perf', ['--version'], { stdio: 'ignore' });
} catch {
  throw new Error('profile-side needs `perf` on PATH (Debian package linux-perf)');
}
const ctx = standaloneContext({ repoRoot, tmpPrefix: 'perch-profile-side-' });
const { pin } = ctx;
if (pin.serverCpu === null) throw new Error(`profile-side pins the servers to one CPU: ${pin.note}`);
ctx.options.connections = connections;
const perfData = join(ctx.tmpDir, 'perf.data');
const stops = [];
let servers;
try {
  const upstream = await startUpstream(ctx);
  stops.push(upstream.proc);
  // The two servers started from here on inherit it (startScript and startPerch pass the
  // environment on); so does the child perch relaunches on Node 20.
  process.env.NODE_OPTIONS = `${process.env.NODE_OPTIONS ?? ''} --perf-basic-prof`.trim();
  const bound = await startMinimalPath(ctx, HIT_USER_ID, { ownSession: true, logName: 'plain-beside-perch' });
  stops.push(bound.proc);
  const perch = await startPerch(ctx, 'perch-profile-side', { upstreamUrl: upstream.url, ttl: { tweets: 3600 } }, { ownSession: true });
  stops.push(perch.proc);
  await primeHit(bound.url, 'plain bound', () => true);
  await primeHit(perch.url, 'perch', (status) => status.startsWith('perch; hit'));
  servers = [
    { name: 'bound', url: bound.url, pids: [bound.proc.pid] },
    { name: 'perch', url: perch.url, pids: perch.pids },
  ];
  const load = (seconds) =>
    Promise.all(
      servers.map((s) => wrk({ url: s.url, path: HIT_PATH, headers: { 'x-api-key': BENCH_KEY }, connections, durationS: seconds, cpu: pin.clientCpu, serverCpu: pin.serverCpu, serverPids: s.pids })),
    );
  await load(warmupS);
  const recording = spawn('perf', ['record', '-q', '-e', 'cpu-clock', '-C', String(pin.serverCpu), '-o', perfData, '--', 'sleep', String(durationS)], { stdio: 'ignore' });
  const recorded = new Promise((done) => recording.on('exit', done));
  const runs = await load(durationS);
  await recorded;
  servers.forEach((s, i) => (s.run = runs[i]));
} finally {
  for (const proc of stops.reverse()) await proc.stop();
}

for (const pid of servers.flatMap((s) => s.pids)) {
  const map = `/tmp/perf-${pid}.map`;
  if (existsSync(map)) writeFileSync(map, newestPerfMap(readFileSync(map, 'utf8')));
}
const samples = execFileSync('perf', ['script', '-i', perfData, '-F', 'pid,tid,ip,sym,dso'], { encoding: 'utf8', maxBuffer: 1 << 30, stdio: ['ignore', 'pipe', 'ignore'] });
const [bound, perch] = servers;
const processOf = new Map(servers.flatMap((s) => s.pids.map((pid) => [pid, s.name])));
const counts = { bound: new Map(), perch: new Map() };
for (const line of samples.split('\n')) {
  const match = /^\s*(\d+)\/(\d+)\s+\S+\s+(.*?)\s+\((.*)\)\s*$/.exec(line);
  if (match === null) continue;
  const name = processOf.get(Number(match[1]));
  if (name === undefined) continue;
  const helper = match[1] !== match[2];
  const key = `${helper ? '[helper thread] ' : ''}${areaOf(match[3], match[4])}\t${match[3]}`;
  counts[name].set(key, (counts[name].get(key) ?? 0) + 1);
}
for (const s of servers) {
  for (const file of readdirSync('/tmp').filter((f) => s.pids.some((pid) => f === `perf-${pid}.map`))) rmSync(join('/tmp', file), { force: true });
  for (const dir of [repoRoot, benchDir]) {
    for (const file of readdirSync(dir).filter((f) => s.pids.some((pid) => f.startsWith('isolate-') && f.endsWith(`-${pid}-v8.log`)))) rmSync(join(dir, file), { force: true });
  }
}

const report = perchMinusBound(counts, { bound: bound.run.rps, perch: perch.run.rps });
console.log(`side by side on CPU ${pin.serverCpu}, ${connections} connections each, ${durationS} s recorded after ${warmupS} s of warm-up:`);
for (const s of servers) {
  console.log(`  ${s.name}: ${s.run.rps.toFixed(0)} hits/s, server CPU ${(s.run.serverCpu * 100).toFixed(0)}%, generator CPU ${(s.run.generatorCpu * 100).toFixed(0)}%`);
}
console.log(`perch's CPU per hit: ${report.ratio.toFixed(3)}x the bound's (samples ${report.samples.perch} and ${report.samples.bound})\n`);
console.log('by area, as shares of the bound\'s CPU per hit: perch, the bound, the difference');
for (const a of report.areas) console.log(`  ${fmt(a.perch)} ${fmt(a.bound)} ${fmt(a.diff, true)}  ${a.name}`);
console.log(`\nthe ${topN} symbols that differ most:`);
for (const s of report.symbols.slice(0, topN)) console.log(`  ${fmt(s.diff, true)}  ${s.name}`);

function fmt(share, signed = false) {
  return `${signed && share >= 0 ? '+' : ''}${(share * 100).toFixed(2)}%`.padStart(8);
}
