// Sick upstream (issues 11 and 27): what clients get for keys not yet cached while the provider
// is half-sick, dead, or healing, under perch's default breaker and throttle. New keys are sent
// open loop at a fixed rate (default 50/s for 20 s per phase, as the issue measured it), and the
// provider, in this process, records the time of every call. Phases:
// - every other call 503, `retries: 0` and `retries: 2`: the share answered 200 (target >= 45%)
//   and upstream calls per miss (<= 1.0 and <= 1.2);
// - dead (every call 503): the share of misses after the first 2 s that reach it (<= 10%);
// - a 10 s outage, then healthy: how long after the heal new keys are served again (<= 5 s), and
//   the 502s answered after it.
// About 80 s. Standalone: `node bench/scenarios/sick-upstream.mjs` (after `npm ci` in bench/ and
// `npm run build` at the root); in run.mjs its export has the shape of the other scenarios.
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { request } from 'undici';
import { bodyFactory } from '../lib/bodies.mjs';
import { issueAtRate } from '../lib/load.mjs';
import { BENCH_KEY, ensureBuilt, startPerchYaml } from '../lib/perch.mjs';
import { installCleanup } from '../lib/procs.mjs';

const RATE = Number(process.env.BENCH_SICK_RATE ?? 50);
const SECONDS = Number(process.env.BENCH_SICK_SECONDS ?? 20);
const OUTAGE_MS = 10_000;

/**
 * A provider in this process answering each call as `fails(call number, ms since start)` says:
 * 503 (no Retry-After) when true, else a user body. Records each call's time.
 */
async function startSickUpstream(fails) {
  const bodies = bodyFactory();
  const calls = [];
  const t0 = performance.now();
  const server = createServer((req, res) => {
    const at = performance.now() - t0;
    calls.push(at);
    if (fails(calls.length, at)) {
      res.writeHead(503, { 'content-type': 'application/json', 'content-length': 2 });
      res.end('{}');
      return;
    }
    const id = /^\/v1\/users\/(\d+)/.exec(req.url ?? '')?.[1] ?? '1';
    const body = bodies.user(id);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    res.end(body);
  });
  server.keepAliveTimeout = 60_000;
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    calls,
    t0,
    close: () => new Promise((resolve) => (server.closeAllConnections(), server.close(resolve))),
  };
}

function config(port, upstreamUrl, protection) {
  return `server: { host: 127.0.0.1, port: ${port} }
auth:
  keys:
    - { id: bench, key: "${BENCH_KEY}", plan: unlimited }
rate_limits:
  unlimited: { capacity: 1000000000, refill_per_second: 1000000000 }
upstreams:
  sick: { kind: v1, url: "${upstreamUrl}", timeout_ms: 2000${protection === '' ? '' : `, ${protection}`} }
cache:
  ttl_seconds: { user: 300 }
log:
  level: warn
`;
}

/** Sums a metric's series whose labels contain `match`. */
async function scrape(url, name, match) {
  const text = await (await request(`${url}/metrics`)).body.text();
  return text
    .split('\n')
    .filter((line) => line.startsWith(`${name}{`) && line.includes(match))
    .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
}

const PHASES = [
  { id: 'half-r0', name: 'every other call 503, retries 0', protection: '', fails: (n) => n % 2 === 0 },
  { id: 'half-r2', name: 'every other call 503, retries 2', protection: 'retries: 2', fails: (n) => n % 2 === 0 },
  { id: 'dead', name: 'dead (every call 503)', protection: '', fails: () => true },
  { id: 'heal', name: `503 for ${OUTAGE_MS / 1000} s, then healthy`, protection: '', fails: (_n, at) => at < OUTAGE_MS },
];

async function phase(ctx, { id, name, protection, fails }, offset) {
  const upstream = await startSickUpstream(fails);
  const perch = await startPerchYaml(ctx, `perch-sick-${id}`, (port) => config(port, upstream.url, protection));
  try {
    // The provider's clock starts with the load, so "the first 2 s" and the heal line up.
    upstream.t0 = performance.now();
    upstream.calls.length = 0;
    const sent = await issueAtRate({
      target: perch.url,
      ratePerSecond: RATE,
      seconds: SECONDS,
      pathOf: (i) => `/v1/users/${offset + i + 1}`,
      headers: { 'x-api-key': BENCH_KEY },
    });
    const statuses = {};
    for (const r of sent) statuses[r.status] = (statuses[r.status] ?? 0) + 1;
    const ok = statuses[200] ?? 0;
    const calls = upstream.calls.length;
    const refused = {};
    for (const reason of ['breaker_open', 'throttled']) refused[reason] = await scrape(perch.url, 'perch_upstream_refused_total', `reason="${reason}"`);
    const result = { id, name, misses: sent.length, ok, okShare: ok / sent.length, calls, callsPerMiss: calls / sent.length, statuses, refused };
    if (id === 'dead') {
      const late = sent.filter((r) => r.sentAt >= 2000).length;
      result.lateShare = upstream.calls.filter((at) => at >= 2000).length / late;
    }
    if (id === 'heal') {
      const firstOk = sent.find((r) => r.sentAt >= OUTAGE_MS && r.status === 200);
      result.recoveryMs = firstOk === undefined ? Infinity : firstOk.sentAt - OUTAGE_MS;
      result.failedAfterHeal = sent.filter((r) => r.sentAt >= OUTAGE_MS && r.status !== 200).length;
    }
    const extra = result.lateShare !== undefined ? `, ${(result.lateShare * 100).toFixed(1)}% of misses after the first 2 s reached the provider` : result.recoveryMs !== undefined ? `, new keys served ${(result.recoveryMs / 1000).toFixed(2)} s after the heal, ${result.failedAfterHeal} not 200 after it` : '';
    result.line = `${name}: ${sent.length} misses at ${RATE}/s, statuses ${JSON.stringify(statuses)} (${(result.okShare * 100).toFixed(1)}% 200), ${calls} upstream calls (${result.callsPerMiss.toFixed(3)} per miss), refused ${JSON.stringify(refused)}${extra}`;
    ctx.log(`  sick upstream ${result.line}`);
    return result;
  } finally {
    await perch.proc.stop();
    await upstream.close();
  }
}

export async function sickUpstreamScenario(ctx) {
  const results = {};
  for (const [i, each] of PHASES.entries()) results[each.id] = await phase(ctx, each, i * 1_000_000);
  const atLeast = (min, unit = '') => ({ text: `>= ${min}${unit}`, pass: (v) => v >= min });
  const atMost = (max, unit = '') => ({ text: `<= ${max}${unit}`, pass: (v) => v <= max });
  return {
    figures: [
      { id: 'sick.half-r0.ok', label: 'share of new keys answered 200, every other call 503, retries 0', runs: [results['half-r0'].okShare], target: atLeast(0.45), decimals: 3 },
      { id: 'sick.half-r0.calls', label: 'upstream calls per miss, every other call 503, retries 0', runs: [results['half-r0'].callsPerMiss], target: atMost(1.0), decimals: 3 },
      { id: 'sick.half-r2.ok', label: 'share of new keys answered 200, every other call 503, retries 2', runs: [results['half-r2'].okShare], target: atLeast(0.45), decimals: 3 },
      { id: 'sick.half-r2.calls', label: 'upstream calls per miss, every other call 503, retries 2', runs: [results['half-r2'].callsPerMiss], target: atMost(1.2), decimals: 3 },
      { id: 'sick.dead.late', label: 'share of misses after the first 2 s reaching a dead provider', runs: [results.dead.lateShare], target: atMost(0.1), decimals: 4 },
      { id: 'sick.heal.seconds', label: 'seconds from the heal to the first new key served', runs: [results.heal.recoveryMs / 1000], target: atMost(5), decimals: 2 },
    ],
    notes: [`Sick upstream (default breaker and throttle, new keys open loop at ${RATE}/s for ${SECONDS} s per phase): ${Object.values(results).map((r) => r.line).join('; ')}.`],
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  installCleanup();
  const repoRoot = dirname(dirname(dirname(fileURLToPath(import.meta.url))));
  const perchMain = join(repoRoot, 'dist', 'src', 'main.js');
  ensureBuilt(repoRoot, perchMain);
  const tmpDir = mkdtempSync(join(os.tmpdir(), 'perch-bench-sick-'));
  const ctx = { repoRoot, perchMain, tmpDir, pin: { serverCpu: null }, log: (line) => process.stderr.write(`${line}\n`) };
  try {
    const { figures, notes } = await sickUpstreamScenario(ctx);
    for (const f of figures) process.stdout.write(`${f.label}: ${f.runs[0].toFixed(3)} (target ${f.target.text})\n`);
    process.stdout.write(`${notes.join('\n')}\n`);
  } finally {
    rmSync(tmpDir, { recursive: true, force: true });
  }
}
