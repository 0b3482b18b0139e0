#!/usr/bin/env node
// `npm run miss-tail` from bench/: who had the server CPU while a miss was slow (issue 22, item 1).
// perch and the upstream stand-in share the server CPU as in the miss scenario; one client on the
// client CPU sends misses one at a time (a new path each), timing each from the client. Meanwhile
// `perf record -e sched:sched_switch -k CLOCK_MONOTONIC -C <server CPU>` notes which thread ran
// when, on the clock process.hrtime reads, so each request's time on the server CPU splits into
// perch's main thread, its V8 workers (GC and compiler) and libuv's pool (node 22 and later name
// their threads; on Node 20 both are "perch's other threads"), the upstream, other processes and
// idle. Printed for the slow requests (over BENCH_SLOW_MS) and for all of them. Needs `perf`
// (Debian: linux-perf) and the right to record the CPU (root, or kernel.perf_event_paranoid <= 0).
// BENCH_DURATION_S (10) recorded, after BENCH_WARMUP_S (5); BENCH_SLOW_MS (2); BENCH_PERCH_NODE_ARGS
// (none): node flags for perch, space-separated (`--single-threaded-gc` leaves V8 no GC threads).
import { execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client } from 'undici';
import { BENCH_KEY, startPerch } from './lib/perch.mjs';
import { startUpstream } from './lib/servers.mjs';
import { perchRoot, standaloneContext } from './lib/standalone.mjs';
import { percentile } from './lib/stats.mjs';

const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
const warmupS = Number(process.env.BENCH_WARMUP_S ?? 5);
const slowMs = Number(process.env.BENCH_SLOW_MS ?? 2);
const nodeArgs = (process.env.BENCH_PERCH_NODE_ARGS ?? '').split(' ').filter(Boolean);

try {
  execFileSync('perf', ['--version'], { stdio: 'ignore' });
} catch {
  throw new Error('miss-tail needs `perf` on PATH (Debian package linux-perf)');
}
const ctx = standaloneContext({ repoRoot: perchRoot(), tmpPrefix: 'perch-miss-tail-' });
if (ctx.pin.serverCpu === null) throw new Error(`miss-tail pins the servers to one CPU: ${ctx.pin.note}`);
const perfData = join(ctx.tmpDir, 'sched.data');
const stops = [];
try {
  const upstream = await startUpstream(ctx);
  stops.push(upstream.proc);
  const perch = await startPerch(ctx, 'perch-miss-tail', { upstreamUrl: upstream.url, ttl: { tweets: 3600 } }, { nodeArgs });
  stops.push(perch.proc);
  // On Node 20 the last of the tree is the perch that serves (its launcher idles above it).
  const server = perch.pids.at(-1);
  const client = new Client(perch.url, { pipelining: 1 });
  let id = 0;
  const misses = async (seconds, record) => {
    const end = process.hrtime.bigint() + BigInt(Math.round(seconds * 1e9));
    while (process.hrtime.bigint() < end) {
      const start = process.hrtime.bigint();
      const res = await client.request({ path: `/v1/users/1${String(++id).padStart(18, '0')}/tweets`, method: 'GET', headers: { 'x-api-key': BENCH_KEY } });
      await res.body.dump();
      if (res.statusCode !== 200) throw new Error(`perch answered ${res.statusCode} on a miss`);
      record?.push([Number(start) / 1e6, Number(process.hrtime.bigint()) / 1e6]);
    }
  };
  await misses(warmupS);
  const perf = spawn('perf', ['record', '-q', '-e', 'sched:sched_switch', '-k', 'CLOCK_MONOTONIC', '-C', String(ctx.pin.serverCpu), '-o', perfData, '--', 'sleep', String(durationS + 1)], { stdio: 'ignore' });
  const requests = [];
  await misses(durationS, requests);
  await new Promise((resolve) => perf.once('close', resolve));
  await client.close();
  // Read while the servers still run: a thread they started during the recording counts too.
  report(requests, runs(perfData, threadClasses(server, upstream.proc.pid)));
} finally {
  for (const proc of stops.reverse()) await proc.stop();
}

/**
 * Thread id -> what it is: perch's main thread, its V8 workers (GC and compiler) and libuv's pool
 * where node names its threads (22 and later), else its other threads; the upstream's.
 */
function threadClasses(perchPid, upstreamPid) {
  const classes = new Map([[0, 'idle']]);
  const named = { V8Worker: "perch's V8 workers", 'libuv-worker': "perch's libuv pool" };
  for (const tid of readdirSync(`/proc/${perchPid}/task`).map(Number)) {
    const name = readFileSync(`/proc/${perchPid}/task/${tid}/comm`, 'utf8').trim();
    classes.set(tid, tid === perchPid ? 'perch main thread' : (named[name] ?? "perch's other threads"));
  }
  for (const tid of readdirSync(`/proc/${upstreamPid}/task`).map(Number)) classes.set(tid, 'upstream stand-in');
  return classes;
}

/** [start ms, end ms, class] for every stretch one thread ran on the CPU, from the switches. */
function runs(file, classes) {
  const text = execFileSync('perf', ['script', '-i', file, '-F', 'time,trace'], { encoding: 'utf8', maxBuffer: 1 << 30, stdio: ['ignore', 'pipe', 'ignore'] });
  const out = [];
  let last;
  for (const line of text.split('\n')) {
    const m = /^\s*([\d.]+):.*next_pid=(\d+)/.exec(line);
    if (m === null) continue;
    const at = Number(m[1]) * 1000;
    if (last !== undefined) out.push([last.at, at, last.cls]);
    const tid = Number(m[2]);
    last = { at, cls: classes.get(tid) ?? 'other processes' };
  }
  return out;
}

function report(requests, stretches) {
  const lo = stretches[0][0];
  const hi = stretches.at(-1)[1];
  const inside = requests.filter(([s, e]) => s >= lo && e <= hi);
  const latency = inside.map(([s, e]) => e - s).sort((a, b) => a - b);
  const q = (p) => percentile(latency, p).toFixed(3);
  console.log(`${inside.length} misses recorded, one at a time: p50 ${q(50)} ms, p90 ${q(90)} ms, p99 ${q(99)} ms, max ${q(100)} ms`);
  const slow = inside.filter(([s, e]) => e - s > slowMs);
  for (const [label, set] of [[`the ${slow.length} misses over ${slowMs} ms`, slow], [`all ${inside.length} misses`, inside]]) {
    const by = new Map();
    let total = 0;
    // Both lists are in time order: walk them together.
    let k = 0;
    for (const [s, e] of set) {
      total += e - s;
      while (k < stretches.length && stretches[k][1] <= s) k++;
      for (let j = k; j < stretches.length && stretches[j][0] < e; j++) {
        const [a, b, cls] = stretches[j];
        by.set(cls, (by.get(cls) ?? 0) + Math.min(b, e) - Math.max(a, s));
      }
    }
    console.log(`\nServer CPU during ${label} (${total.toFixed(1)} ms in all):`);
    for (const [cls, ms] of [...by].sort((x, y) => y[1] - x[1])) console.log(`  ${cls.padEnd(24)} ${ms.toFixed(1).padStart(9)} ms  ${((100 * ms) / total).toFixed(1).padStart(5)}%`);
  }
}
