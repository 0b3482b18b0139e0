// Sick upstream (issue 11): a provider failing every other call with a 503 must never see a retry
// storm. perch runs with `retries: 2` and the default budget (20% of requests, at least 1/s);
// distinct misses are sent at a fixed concurrency and the provider counts its calls. Two phases:
// the breaker kept out of the way (the budget alone bounds the calls), then the default breaker.
// Under a minute. Standalone: `node bench/scenarios/sick-upstream.mjs` (after `npm ci` in bench/
// and `npm run build` at the root); in run.mjs its export has the shape of the other scenarios.
import { mkdtempSync, openSync, closeSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { request } from 'undici';
import { bodyFactory } from '../lib/bodies.mjs';
import { issueAll } from '../lib/load.mjs';
import { BENCH_KEY, ensureBuilt } from '../lib/perch.mjs';
import { freePort, installCleanup, sleep, start } from '../lib/procs.mjs';

const MISSES = Number(process.env.BENCH_SICK_MISSES ?? 2000);
const CONCURRENCY = Number(process.env.BENCH_SICK_CONCURRENCY ?? 16);
const PHASES = [
  { name: 'budget alone', protection: 'retries: 2, breaker: { consecutive_failures: 10000, failure_ratio: 1 }' },
  { name: 'default breaker', protection: 'retries: 2' },
];

/** A provider in this process answering every `every`-th call 503 (no Retry-After), counting calls. */
async function startSickUpstream(every) {
  const bodies = bodyFactory();
  let calls = 0;
  const server = createServer((req, res) => {
    calls++;
    if (calls % every === 0) {
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
    calls: () => calls,
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
  sick: { kind: v1, url: "${upstreamUrl}", timeout_ms: 2000, ${protection} }
cache:
  ttl_seconds: { user: 300 }
log:
  level: warn
`;
}

async function startPerchWith(ctx, name, yamlFor) {
  const port = await freePort();
  const file = join(ctx.tmpDir, `${name}.yaml`);
  writeFileSync(file, yamlFor(port));
  const logFd = openSync('/dev/null', 'a');
  const proc = start(name, process.execPath, [ctx.perchMain, '--config', file], { cpu: ctx.pin.serverCpu, cwd: ctx.repoRoot, stdout: logFd });
  closeSync(logFd);
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 15_000;
  for (;;) {
    try {
      const res = await request(`${url}/healthz`);
      await res.body.dump();
      return { proc, url };
    } catch {
      if (!proc.alive() || Date.now() > deadline) {
        await proc.stop();
        throw new Error(`${name} did not start: ${proc.stderr().trim()}`);
      }
      await sleep(50);
    }
  }
}

/** Sums a metric's series whose labels contain `match`. */
async function scrape(url, name, match) {
  const text = await (await request(`${url}/metrics`)).body.text();
  return text
    .split('\n')
    .filter((line) => line.startsWith(`${name}{`) && line.includes(match))
    .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
}

async function phase(ctx, { name, protection }, offset) {
  const upstream = await startSickUpstream(2);
  const perch = await startPerchWith(ctx, `perch-sick-${offset}`, (port) => config(port, upstream.url, protection));
  try {
    const result = await issueAll({
      targets: [perch.url],
      count: MISSES,
      pathOf: (i) => `/v1/users/${offset + i + 1}`,
      headers: { 'x-api-key': BENCH_KEY },
      concurrency: CONCURRENCY,
      deadlineMs: 50_000,
    });
    const decisions = {};
    for (const d of ['retried', 'budget_exhausted', 'no_time', 'exhausted']) decisions[d] = await scrape(perch.url, 'perch_upstream_retries_total', `decision="${d}"`);
    const refused = await scrape(perch.url, 'perch_upstream_refused_total', 'reason="breaker_open"');
    const calls = upstream.calls();
    const line = `${name}: ${result.issued} misses in ${result.seconds.toFixed(1)} s, statuses ${JSON.stringify(result.statuses)}, ${calls} upstream calls (${(calls / result.issued).toFixed(3)} per miss), retries ${JSON.stringify(decisions)}, ${refused} refused by the open breaker`;
    ctx.log(`  sick upstream ${line}`);
    return { name, calls, misses: result.issued, ok: result.ok, line };
  } finally {
    await perch.proc.stop();
    await upstream.close();
  }
}

export async function sickUpstreamScenario(ctx) {
  const results = [];
  for (const [i, each] of PHASES.entries()) results.push(await phase(ctx, each, i * 1_000_000));
  const within = { text: '<= 1.2 calls per miss', pass: (v) => v <= 1.2 };
  return {
    figures: results.map((r, i) => ({
      id: `sick.${i}`,
      label: `upstream calls per miss, every other call 503, ${r.name}`,
      runs: [r.calls / r.misses],
      target: within,
      decimals: 3,
    })),
    notes: [`Sick upstream (every other call 503, retries 2, budget 20%, ${CONCURRENCY} connections): ${results.map((r) => r.line).join('; ')}.`],
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
