#!/usr/bin/env node
// `npm run profile` from bench/: one hit-path run against perch started with `node --cpu-prof`,
// then the top self-time functions. The profile is kept in bench/profiles/ (git-ignored
// *.cpuprofile). BENCH_DURATION_S (10), BENCH_CONNECTIONS (64), BENCH_PROFILE_TOP (10).
// BENCH_PROFILE_MISS=1 profiles the miss path instead: the page is not cached (ttl 0).
// BENCH_PROFILE_TRACING=<sample_ratio> turns tracing on, exporting to an OTLP/HTTP sink in this process.
import { createServer } from 'node:http';
import { readdirSync, rmSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BENCH_KEY, get, perchConfig, startPerchYaml } from './lib/perch.mjs';
import { summarizeProfile } from './lib/profile.mjs';
import { startUpstream } from './lib/servers.mjs';
import { perchRoot, standaloneContext } from './lib/standalone.mjs';
import { wrk } from './lib/wrk.mjs';
import { HIT_PATH } from './scenarios/hit.mjs';

const benchDir = dirname(fileURLToPath(import.meta.url));
const repoRoot = perchRoot();
const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
const connections = Number(process.env.BENCH_CONNECTIONS ?? 64);
const topN = Number(process.env.BENCH_PROFILE_TOP ?? 10);
const missPath = process.env.BENCH_PROFILE_MISS === '1';
const traceRatio = process.env.BENCH_PROFILE_TRACING;

const ctx = standaloneContext({ repoRoot, tmpPrefix: 'perch-profile-' });
const { pin } = ctx;
const profileDir = join(benchDir, 'profiles', new Date().toISOString().replace(/[:.]/g, '-'));

const window = { fromUs: 0, toUs: 0 };
const sink = createServer((req, res) => req.resume().on('end', () => res.writeHead(200).end()));
await new Promise((done) => sink.listen(0, '127.0.0.1', done));
const tracingYaml = traceRatio === undefined ? '' : `tracing: { endpoint: "http://127.0.0.1:${sink.address().port}", sample_ratio: ${Number(traceRatio)} }\n`;
const stopSink = () => {
  sink.closeAllConnections();
  sink.close();
};
const upstream = await startUpstream(ctx);
let perch;
try {
  const yaml = (port) => perchConfig({ port, upstreamUrl: upstream.url, ttl: { tweets: missPath ? 0 : 3600 }, metricsYaml: ctx.metricsYaml }) + tracingYaml;
  perch = await startPerchYaml(ctx, 'perch-profile', yaml, { cpuProfileDir: profileDir });
} catch (error) {
  await upstream.proc.stop();
  stopSink();
  rmSync(profileDir, { recursive: true, force: true }); // a profile of a failed start is noise
  throw error;
}
try {
  await get(perch.url, HIT_PATH);
  const hit = await get(perch.url, HIT_PATH);
  if (!String(hit.headers['cache-status']).startsWith(missPath ? 'perch; fwd=miss' : 'perch; hit')) throw new Error(`unexpected cache-status ${hit.headers['cache-status']}`);
  window.fromUs = Number(process.hrtime.bigint() / 1000n);
  const result = await wrk({ url: perch.url, path: HIT_PATH, headers: { 'x-api-key': BENCH_KEY }, connections, durationS, cpu: pin.clientCpu, serverCpu: pin.serverCpu, serverPids: perch.pids });
  window.toUs = Number(process.hrtime.bigint() / 1000n);
  console.log(`profiled ${missPath ? 'miss' : 'hit'} run (${durationS} s, ${connections} conns, --cpu-prof on): ${result.rps.toFixed(0)} req/s, p50 ${result.p50.toFixed(2)} ms, p99 ${result.p99.toFixed(2)} ms, server CPU ${(result.serverCpu * 100).toFixed(0)}%, generator CPU ${(result.generatorCpu * 100).toFixed(0)}%`);
} finally {
  await perch.proc.stop(15_000); // SIGTERM: perch exits cleanly and V8 writes the profile
  await upstream.proc.stop();
  stopSink();
}
// On Node 20 perch's launcher writes a profile too (it relaunches perch to size its heap): the
// largest file is perch's, the one that served the load.
const files = readdirSync(profileDir)
  .filter((f) => f.endsWith('.cpuprofile'))
  .map((f) => join(profileDir, f))
  .sort((a, b) => statSync(b).size - statSync(a).size);
if (files.length === 0) throw new Error(`no .cpuprofile written in ${profileDir}`);
const summary = summarizeProfile(files[0], topN, repoRoot, window);
console.log(`\nprofile: ${files[0]}`);
console.log(`${summary.windowed ? 'samples taken during the load run only' : 'all samples (start-up included: the load window did not match the profile clock)'}: ${summary.totalMs.toFixed(0)} ms, busy (not idle) ${summary.busyMs.toFixed(0)} ms\n`);
console.log(`top ${topN} by self time (share of busy time):`);
summary.top.forEach((f, i) => console.log(`${String(i + 1).padStart(2)}. ${(f.share * 100).toFixed(1).padStart(5)}%  ${f.ms.toFixed(0).padStart(6)} ms  ${f.name}  ${f.where}`));
console.log('\nself time by area:');
for (const a of summary.areas) console.log(`  ${(a.share * 100).toFixed(1).padStart(5)}%  ${a.area}`);
