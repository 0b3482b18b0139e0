// Fairness (issue 21): the provider's call cap shared among client keys whose misses wait for it.
// Misses on distinct ids are sent open loop per key; the provider, in this process, records the
// time of every call and whose it was (the ids are per key). Phases, 15 s each by default:
// - cap 10/s, one instance: a crawler at 50/s and an app at 2/s. Targets: the app gets >= 99%
//   200 with p99 <= 600 ms; the provider gets >= 85% of the cap's capacity, never more than the
//   cap in any one-second window;
// - the same over two instances sharing Redis, the crawler on both (25/s each), the app on one;
// - cap 20/s, two keys flooding at 60/s each, plans of provider_weight 3 and 1: the weight-3 key
//   gets 75% +- 7 points of the answered misses.
// Standalone: `node bench/scenarios/fairness.mjs` (after `npm ci` in bench/ and `npm run build`
// at the root); in run.mjs its export has the shape of the other scenarios.
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { bodyFactory } from '../lib/bodies.mjs';
import { issueAtRate } from '../lib/load.mjs';
import { ensureBuilt, startPerchYaml } from '../lib/perch.mjs';
import { installCleanup } from '../lib/procs.mjs';
import { startRedis } from '../lib/redis.mjs';
import { percentile } from '../lib/stats.mjs';

const SECONDS = Number(process.env.BENCH_FAIR_SECONDS ?? 15);
const KEYS = { crawler: 'fair-crawler-key-0123456789abcdef', app: 'fair-app-key-0123456789abcdef0', heavy: 'fair-heavy-key-0123456789abcdef', light: 'fair-light-key-0123456789abcdef' };
/** Each key's misses use ids from its own range, so the provider can tell whose call it got. */
const BASE = { crawler: 1_000_000, app: 2_000_000, heavy: 3_000_000, light: 4_000_000 };
const owner = (id) => Object.keys(BASE).findLast((k) => id >= BASE[k]);

/** A healthy provider in this process, recording each call's time (ms since `t0`) and owner. */
async function startProvider() {
  const bodies = bodyFactory();
  const calls = [];
  const provider = { calls, t0: performance.now() };
  const server = createServer((req, res) => {
    const id = Number(/^\/v1\/users\/(\d+)/.exec(req.url ?? '')?.[1] ?? 0);
    calls.push({ at: performance.now() - provider.t0, owner: owner(id) });
    const body = bodies.user(String(id));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    res.end(body);
  });
  server.keepAliveTimeout = 60_000;
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  provider.url = `http://127.0.0.1:${server.address().port}`;
  provider.close = () => new Promise((resolve) => (server.closeAllConnections(), server.close(resolve)));
  return provider;
}

function config(port, providerUrl, cap, { redisUrl, weights = {} } = {}) {
  const plan = (name) => `  ${name}: { capacity: 1000000, refill_per_second: 1000000, provider_weight: ${weights[name] ?? 1} }`;
  return `server: { host: 127.0.0.1, port: ${port} }
auth:
  keys:
${Object.entries(KEYS).map(([id, key]) => `    - { id: ${id}, key: "${key}", plan: ${id} }`).join('\n')}
rate_limits:
${Object.keys(KEYS).map(plan).join('\n')}
${redisUrl ? `rate_limits_redis: { url: "${redisUrl}", command_timeout_ms: 1000 }\n` : ''}upstreams:
  main: { kind: v1, url: "${providerUrl}", timeout_ms: 5000, max_requests_per_second: ${cap} }
cache:
  ttl_seconds: { user: 300 }
log:
  level: warn
`;
}

/** Sends each key's misses open loop at its rate to its instance, all at once. */
function load(flows) {
  return Promise.all(
    flows.map(({ key, url, rate, offset = 0 }) =>
      issueAtRate({ target: url, ratePerSecond: rate, seconds: SECONDS, pathOf: (i) => `/v1/users/${BASE[key] + offset + i}`, headers: { 'x-api-key': KEYS[key] } }),
    ),
  );
}

/**
 * The most calls any one-second window held, and the share of the cap's capacity used: its burst
 * (`ceil(rate)` by default) plus `rate` a second over the run.
 */
function capUse(calls, cap) {
  const times = calls.map((c) => c.at).sort((a, b) => a - b);
  let busiest = 0;
  for (let i = 0, j = 0; i < times.length; i++) {
    while (times[i] - times[j] >= 1000) j++;
    busiest = Math.max(busiest, i - j + 1);
  }
  return { busiest, used: times.length / (cap * SECONDS + Math.ceil(cap)) };
}

const share200 = (results) => results.filter((r) => r.status === 200).length / results.length;
const statuses = (results) => results.reduce((t, r) => ({ ...t, [r.status]: (t[r.status] ?? 0) + 1 }), {});

async function appPhase(ctx, name, instances) {
  const provider = await startProvider();
  const redis = instances > 1 ? await startRedis(ctx) : undefined;
  const perches = [];
  try {
    for (let i = 0; i < instances; i++) perches.push(await startPerchYaml(ctx, `perch-fair-${name}-${i}`, (port) => config(port, provider.url, 10, { redisUrl: redis?.url })));
    provider.calls.length = 0;
    provider.t0 = performance.now();
    const crawlers = perches.map((p, i) => ({ key: 'crawler', url: p.url, rate: 50 / instances, offset: i * 100_000 }));
    const results = await load([{ key: 'app', url: perches[0].url, rate: 2 }, ...crawlers]);
    const app = results[0];
    const crawler = results.slice(1).flat();
    const use = capUse(provider.calls, 10);
    const result = {
      name,
      appOk: share200(app),
      appP50: percentile(app.filter((r) => r.status === 200).map((r) => r.ms).sort((a, b) => a - b), 50),
      appP99: percentile(app.filter((r) => r.status === 200).map((r) => r.ms).sort((a, b) => a - b), 99),
      busiest: use.busiest,
      used: use.used,
    };
    result.line = `${name}: app ${JSON.stringify(statuses(app))} (${(result.appOk * 100).toFixed(1)}% 200, p50 ${result.appP50.toFixed(0)} ms, p99 ${result.appP99.toFixed(0)} ms), crawler ${JSON.stringify(statuses(crawler))}, provider ${provider.calls.length} calls (${(use.used * 100).toFixed(1)}% of the cap's ${10 * SECONDS + 10}, burst included; busiest 1 s window ${use.busiest})`;
    ctx.log(`  fairness ${result.line}`);
    return result;
  } finally {
    for (const p of perches) await p.proc.stop();
    await redis?.proc.stop();
    await provider.close();
  }
}

async function weightPhase(ctx) {
  const provider = await startProvider();
  const perch = await startPerchYaml(ctx, 'perch-fair-weights', (port) => config(port, provider.url, 20, { weights: { heavy: 3, light: 1 } }));
  try {
    provider.calls.length = 0;
    const [heavy, light] = await load([
      { key: 'heavy', url: perch.url, rate: 60 },
      { key: 'light', url: perch.url, rate: 60 },
    ]);
    const [h, l] = [heavy.filter((r) => r.status === 200).length, light.filter((r) => r.status === 200).length];
    const result = { heavyShare: h / (h + l) };
    result.line = `cap 20/s, weights 3 and 1, both at 60/s: weight 3 ${JSON.stringify(statuses(heavy))}, weight 1 ${JSON.stringify(statuses(light))}: the weight-3 key got ${(result.heavyShare * 100).toFixed(1)}% of the answered misses`;
    ctx.log(`  fairness ${result.line}`);
    return result;
  } finally {
    await perch.proc.stop();
    await provider.close();
  }
}

export async function fairnessScenario(ctx) {
  const one = await appPhase(ctx, 'one instance', 1);
  const two = await appPhase(ctx, 'two instances + Redis', 2);
  const weights = await weightPhase(ctx);
  const atLeast = (min) => ({ text: `>= ${min}`, pass: (v) => v >= min });
  const atMost = (max) => ({ text: `<= ${max}`, pass: (v) => v <= max });
  const figures = [];
  for (const [id, r] of [['one', one], ['two', two]]) {
    figures.push(
      { id: `fair.${id}.app`, label: `share of the app's misses answered 200, ${r.name}`, runs: [r.appOk], target: atLeast(0.99), decimals: 3 },
      { id: `fair.${id}.p50`, label: `app p50 (ms), ${r.name}`, runs: [r.appP50], decimals: 0 },
      { id: `fair.${id}.p99`, label: `app p99 (ms), ${r.name}`, runs: [r.appP99], target: atMost(600), decimals: 0 },
      { id: `fair.${id}.used`, label: `share of the cap's capacity the provider got, ${r.name}`, runs: [r.used], target: atLeast(0.85), decimals: 3 },
      { id: `fair.${id}.busiest`, label: `most provider calls in any 1 s window (cap 10), ${r.name}`, runs: [r.busiest], target: atMost(10), decimals: 0 },
    );
  }
  figures.push({ id: 'fair.weights', label: 'share of answered misses of the weight-3 key (weights 3 and 1)', runs: [weights.heavyShare], target: { text: '0.75 +- 0.07', pass: (v) => Math.abs(v - 0.75) <= 0.07 }, decimals: 3 });
  return { figures, notes: [`Fairness (${SECONDS} s per phase, open loop): ${[one, two, weights].map((r) => r.line).join('; ')}.`] };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  installCleanup();
  const repoRoot = dirname(dirname(dirname(fileURLToPath(import.meta.url))));
  const perchMain = join(repoRoot, 'dist', 'src', 'main.js');
  ensureBuilt(repoRoot, perchMain);
  const tmpDir = mkdtempSync(join(os.tmpdir(), 'perch-bench-fair-'));
  const ctx = { repoRoot, perchMain, tmpDir, pin: { serverCpu: null }, log: (line) => process.stderr.write(`${line}\n`) };
  try {
    const { figures, notes } = await fairnessScenario(ctx);
    for (const f of figures) process.stdout.write(`${f.label}: ${f.runs[0].toFixed(f.decimals)} (target ${f.target.text}) ${f.target.pass(f.runs[0]) ? 'PASS' : 'MISS'}\n`);
    process.stdout.write(`${notes.join('\n')}\n`);
  } finally {
    rmSync(tmpDir, { recursive: true, force: true });
  }
}
