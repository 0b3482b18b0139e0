// Provider protection (issue 10): what the provider sees from two perch instances sharing a Redis.
//   1. Call cap: 200 distinct misses at once, split over the two instances, against an upstream
//      with `max_requests_per_second: 10`; the upstream's own arrival log is counted per
//      one-second window (aligned on the first call) and over every sliding 1 s window.
//   2. Cool-down: one miss draws a 429 with `Retry-After: 30` and gets its answer, then a steady
//      stream of new misses (20 per second for 40 s over both instances); calls the upstream
//      receives in the 30 s after the 429, and after them.
// The upstream is a node:http server in this process, so its clock and the counts are exact.
// Also runnable alone: `npm run quota` (from bench/).
import { createServer } from 'node:http';
import { closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { request } from 'undici';
import { bodyFactory } from '../lib/bodies.mjs';
import { BENCH_KEY, ensureBuilt } from '../lib/perch.mjs';
import { freePort, installCleanup, sleep, start, waitUntilServing } from '../lib/procs.mjs';
import { redisAvailable, startRedis } from '../lib/redis.mjs';

const RATE = 10;
const MISSES = 200;
const RETRY_AFTER_S = 30;
const STREAM_PER_S = 20;
const STREAM_S = 40;

export async function quotaScenario(ctx) {
  if (!redisAvailable()) {
    return { figures: [{ id: 'quota.cap', label: 'calls in the busiest 1 s window, cap 10/s', unavailable: 'no redis-server' }], notes: [] };
  }
  const bodies = bodyFactory();
  const upstream = await countingUpstream((id) => bodies.user(id));
  const redis = await startRedis(ctx);
  const stops = [redis.proc];
  try {
    const a = await startInstance(ctx, 'quota-a', upstream.url, redis.url);
    const b = await startInstance(ctx, 'quota-b', upstream.url, redis.url);
    stops.push(a.proc, b.proc);

    // 1. The call cap.
    const base = 3_000_000_000_000_000_000n;
    const statuses = await Promise.all(Array.from({ length: MISSES }, (_, i) => get(i % 2 === 0 ? a.url : b.url, `/v1/users/${base + BigInt(i)}`)));
    const arrivals = upstream.take();
    const perWindow = windows(arrivals);
    const sliding = Math.max(...arrivals.map((t0) => arrivals.filter((t) => t >= t0 && t < t0 + 1000).length));
    const ok = statuses.filter((s) => s === 200).length;

    // 2. The cool-down after a 429: one miss draws it and is answered, then the stream starts.
    // The cap's windows from part 1 are left to empty first, so no queued call is released
    // together with the one that draws the 429.
    await sleep(2000);
    upstream.take();
    upstream.limitNext(RETRY_AFTER_S);
    const first = await get(a.url, `/v1/users/${base + 999_999n}`);
    const streamStart = performance.now();
    const pending = [];
    let n = 0;
    while (performance.now() - streamStart < STREAM_S * 1000) {
      const target = n % 2 === 0 ? a.url : b.url;
      pending.push(get(target, `/v1/users/${base + 1_000_000n + BigInt(n++)}`));
      await sleep(1000 / STREAM_PER_S);
    }
    const streamStatuses = await Promise.all(pending);
    const calls = upstream.take();
    const limitedAt = calls[0] ?? NaN;
    const during = calls.filter((t) => t > limitedAt && t < limitedAt + RETRY_AFTER_S * 1000);
    const inWindow = during.length;
    const after = calls.filter((t) => t >= limitedAt + RETRY_AFTER_S * 1000).length;

    const figures = [
      {
        id: 'quota.cap',
        label: `busiest sliding 1 s window, ${MISSES} misses over 2 instances, cap ${RATE}/s`,
        runs: [sliding],
        decimals: 0,
        target: { text: `<= ${RATE * 1.1}`, pass: (v) => v <= RATE * 1.1 },
      },
      {
        id: 'quota.cooldown',
        label: `upstream calls sent in the ${RETRY_AFTER_S} s after a 429 (Retry-After ${RETRY_AFTER_S})`,
        runs: [inWindow],
        decimals: 0,
        target: { text: '0', pass: (v) => v === 0 },
      },
    ];
    const notes = [
      `Call cap: ${MISSES} distinct misses at once over two instances sharing a Redis, max_requests_per_second ${RATE}, queue_timeout_ms 30000: ${ok} answered 200 (${MISSES - ok} others: ${summarize(statuses)}); upstream calls per one-second window from the first: ${perWindow.join(', ')}; busiest sliding 1 s window ${sliding}.`,
      `Cool-down: one miss through instance a drew a 429 with Retry-After ${RETRY_AFTER_S} (client status ${first}); then ${n} new misses at ${STREAM_PER_S}/s for ${STREAM_S} s over both instances (${summarize(streamStatuses)}). Upstream calls: 1 (the 429); ${during.length} in the ${RETRY_AFTER_S} s after it${during.length > 0 ? `, arriving ${during.map((t) => `${(t - limitedAt).toFixed(1)} ms`).join(', ')} after the 429` : ''}; ${after} after the ${RETRY_AFTER_S} s.`,
      `perch warnings and errors during the scenario: ${warnings(ctx.tmpDir, ['quota-a', 'quota-b'])}.`,
    ];
    return { figures, notes };
  } finally {
    await Promise.all(stops.map((p) => p.stop()));
    await upstream.close();
  }
}

/** The distinct warn and error messages the instances logged, with their counts. */
function warnings(dir, names) {
  const counts = {};
  for (const name of names) {
    for (const line of readFileSync(join(dir, `${name}.log`), 'utf8').split('\n')) {
      if (!line.startsWith('{')) continue;
      const { level, msg } = JSON.parse(line);
      if (level >= 40) counts[msg] = (counts[msg] ?? 0) + 1;
    }
  }
  const list = Object.entries(counts).map(([msg, c]) => `${c} x "${msg}"`);
  return list.length === 0 ? 'none' : list.join('; ');
}

/** Counts per one-second window aligned on the first arrival. */
function windows(arrivals) {
  if (arrivals.length === 0) return [];
  const first = arrivals[0];
  const counts = [];
  for (const t of arrivals) {
    const i = Math.floor((t - first) / 1000);
    counts[i] = (counts[i] ?? 0) + 1;
  }
  return Array.from(counts, (c) => c ?? 0);
}

function summarize(statuses) {
  const counts = {};
  for (const s of statuses) counts[s] = (counts[s] ?? 0) + 1;
  return Object.entries(counts).map(([s, c]) => `${c} x ${s}`).join(', ');
}

async function get(url, path) {
  try {
    const res = await request(url + path, { headers: { 'x-api-key': BENCH_KEY }, headersTimeout: 60_000, bodyTimeout: 60_000 });
    await res.body.dump();
    return res.statusCode;
  } catch {
    return 'error';
  }
}

/** A v1 user endpoint that logs arrival times and can answer its next call 429. */
async function countingUpstream(userBody) {
  let arrivals = [];
  let limitSeconds = 0;
  const server = createServer((req, res) => {
    arrivals.push(performance.now());
    if (limitSeconds > 0) {
      res.writeHead(429, { 'retry-after': String(limitSeconds), 'content-length': 2 });
      limitSeconds = 0;
      res.end('{}');
      return;
    }
    const id = /^\/v1\/users\/(\d+)/.exec(req.url ?? '')?.[1] ?? '1';
    const body = userBody(id);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    res.end(body);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    take: () => {
      const taken = arrivals;
      arrivals = [];
      return taken;
    },
    limitNext: (seconds) => (limitSeconds = seconds),
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

async function startInstance(ctx, name, upstreamUrl, redisUrl) {
  const port = await freePort();
  const file = join(ctx.tmpDir, `${name}.yaml`);
  writeFileSync(
    file,
    `server: { host: 127.0.0.1, port: ${port}, miss_deadline_ms: 60000 }
auth: { keys: [{ id: bench, key: "${BENCH_KEY}", plan: unlimited }] }
rate_limits: { unlimited: { capacity: 1000000000, refill_per_second: 1000000000 } }
upstreams:
  provider: { kind: v1, url: "${upstreamUrl}", max_requests_per_second: ${RATE}, queue_timeout_ms: 30000, queue_size: 1000 }
rate_limits_redis: { url: "${redisUrl}", command_timeout_ms: 250 }
log: { level: warn }
`,
  );
  const logFd = openSync(join(ctx.tmpDir, `${name}.log`), 'a');
  const proc = start(name, process.execPath, [ctx.perchMain, '--config', file], { cpu: ctx.pin?.serverCpu ?? null, cwd: ctx.repoRoot, stdout: logFd });
  closeSync(logFd);
  const url = `http://127.0.0.1:${port}`;
  await waitUntilServing(proc, `${url}/healthz`, { timeoutMs: 15_000 });
  return { proc, url };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  installCleanup();
  const repoRoot = process.env.BENCH_PERCH_ROOT ?? dirname(dirname(dirname(fileURLToPath(import.meta.url))));
  const perchMain = join(repoRoot, 'dist', 'src', 'main.js');
  ensureBuilt(repoRoot, perchMain);
  const tmpDir = mkdtempSync(join(os.tmpdir(), 'perch-quota-'));
  try {
    const { figures, notes } = await quotaScenario({ repoRoot, perchMain, tmpDir, pin: { serverCpu: null } });
    for (const f of figures) process.stdout.write(`${f.label}: ${f.unavailable ?? f.runs.join(' / ')}${f.target ? ` (target ${f.target.text})` : ''}\n`);
    for (const note of notes) process.stdout.write(`- ${note}\n`);
  } finally {
    rmSync(tmpDir, { recursive: true, force: true });
  }
}
