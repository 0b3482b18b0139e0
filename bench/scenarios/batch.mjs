// Batch lookups (issue 44, item 5): misses on `user`, `user_by_username` and `tweet` of an `x_v2`
// upstream that wait for the provider at the same time go as one call to X's batch endpoints
// (`/2/users?ids=`, `/2/users/by?usernames=`, `/2/tweets?ids=`); a lone miss keeps the single
// endpoint. A fake X in this process answers every one of those endpoints after 30 ms with X's
// shapes and records each call (time, path, items). perch runs one `x_v2` upstream capped at
// 2 calls/s (burst 2) and 5 client keys on a plan that never limits. Phases, each with batching
// on and off (`batch: { enabled: false }`), a fresh perch and fake for each:
// - users: 300 distinct user ids in 3 s, open loop (100/s), the 5 keys in turn;
// - usernames: 200 distinct usernames in 3 s (~67/s);
// - tweets: 200 distinct tweet ids in 3 s;
// - lone miss: 5 interleaved rounds (BENCH_BATCH_LONE_ROUNDS; each side first in every other) of
//   100 user misses one at a time (BENCH_BATCH_LONE), on and off side by side, the cap lifted (1000/s) so it never holds one: what a miss waits beyond
//   the fake's 30 ms (p50/p99, medians of the rounds); a lone miss must add no window.
// Per phase: share answered 200 and the statuses, provider calls, items per call (min, median,
// max, from the fake), p50/p99 of the 200s and the same minus the fake's 30 ms ("added"),
// whether each call's query carried the single lookup's field parameters, and, when this build
// exposes them, perch's own batch metrics and the access log's `batch` field.
// Targets (issue 44, "Done when"), batching on: users >= 99% 200 in <= 20 provider calls,
// usernames and tweets >= 99% 200 in <= 14 calls each. The off variant is today's figure.
//
// Batching is measured only when the build has it: when no file under dist/src mentions
// `max_items` (its config key), the off variant runs without a `batch` key (which such a build
// would refuse) and the on figures read "not available: not built". BENCH_BATCH_BUILT=1 or 0
// overrides the detection; BENCH_BATCH_YAML replaces the on variant's section (default
// `{ enabled: true }`, max_items and window_ms at their defaults), e.g. '{ enabled: true, window_ms: 5 }';
// BENCH_BATCH_SECONDS (3) stretches the open-loop phases at the same rates.
// About 40 s with batching built, 20 s without. Standalone: `node bench/scenarios/batch.mjs`
// (after `npm ci` in bench/ and `npm run build` at the root); in run.mjs (`BENCH_ONLY=batch`) its
// export has the shape of the other scenarios.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Pool, request } from 'undici';
import { issueAtRate } from '../lib/load.mjs';
import { startPerchYaml } from '../lib/perch.mjs';
import { evaluate, fmt, printTables } from '../lib/report.mjs';
import { perchRoot, standaloneContext } from '../lib/standalone.mjs';
import { percentile } from '../lib/stats.mjs';

const SECONDS = Number(process.env.BENCH_BATCH_SECONDS ?? 3);
/** How long the fake X takes to answer any call. */
const ANSWER_MS = 30;
const CAP = 2;
const TOKEN = 'AAAAAAAAAAAAAAAAAAAAAPerchBenchToken';
const KEYS = Array.from({ length: 5 }, (_, i) => ({ id: `batch${i}`, key: `perch-batch-key-${i}-0123456789abcdef` }));
const LONE = Number(process.env.BENCH_BATCH_LONE ?? 100);
const LONE_ROUNDS = Number(process.env.BENCH_BATCH_LONE_ROUNDS ?? 5);

/**
 * The open-loop phases: `count` distinct misses in SECONDS, and the issue's targets for the
 * batched variant. Ids start high enough to look like X's and stay under its 19 digits.
 */
const PHASES = [
  { id: 'users', endpoint: 'user', what: 'user ids', count: 300, maxCalls: 20, pathOf: (i) => `/v1/users/${1_400_000_000 + i}` },
  // Mixed case: perch matches usernames case-insensitively and asks X in lowercase.
  { id: 'usernames', endpoint: 'user_by_username', what: 'usernames', count: 200, maxCalls: 14, pathOf: (i) => `/v1/users/by/username/Bench_U${100_000 + i}` },
  { id: 'tweets', endpoint: 'tweet', what: 'tweet ids', count: 200, maxCalls: 14, pathOf: (i) => `/v1/tweets/${1_800_000_000_000_000_000n + BigInt(i)}` },
];

const VARIANTS = [
  { id: 'on', name: 'batched' },
  { id: 'off', name: 'unbatched' },
];

/**
 * Whether this build of perch knows the `batch` section: some file under dist/src names its
 * `max_items` key (BENCH_BATCH_BUILT=1 or 0 decides instead).
 */
export function batchBuilt(repoRoot, env = process.env) {
  if (env.BENCH_BATCH_BUILT === '1' || env.BENCH_BATCH_BUILT === '0') return env.BENCH_BATCH_BUILT === '1';
  const walk = (dir) =>
    readdirSync(dir, { withFileTypes: true }).some((entry) => {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) return walk(path);
      return entry.name.endsWith('.js') && readFileSync(path, 'utf8').includes('max_items');
    });
  const dist = join(repoRoot, 'dist', 'src');
  return existsSync(dist) && walk(dist);
}

/** The `batch` section for a variant, or '' for none (a build without batching refuses the key). */
function batchYaml(variant, built) {
  if (!built) return '';
  return variant.id === 'on' ? (process.env.BENCH_BATCH_YAML ?? '{ enabled: true }') : '{ enabled: false }';
}

/**
 * The query parameters of the build's own single lookups, without the path (from its
 * requests.ts), so the fake can check that each call, batched or not, carries them; undefined
 * when the build has no such module (the check is then skipped).
 */
async function singleQueries(repoRoot) {
  try {
    const { v2Request } = await import(pathToFileURL(join(repoRoot, 'dist', 'src', 'upstream', 'x-v2', 'requests.js')).href);
    const query = (endpoint, params) => new URL(v2Request({ endpoint, params, path: '' }), 'http://x').searchParams;
    return { user: query('user', { user_id: '1' }), user_by_username: query('user_by_username', { username: 'a' }), tweet: query('tweet', { tweet_id: '1' }) };
  } catch {
    return undefined;
  }
}

/** The same parameters, `ids` and `usernames` aside, in any order. */
function sameQuery(got, expected) {
  const pairs = (params) =>
    [...params]
      .filter(([k]) => k !== 'ids' && k !== 'usernames')
      .map(([k, v]) => `${k}=${v}`)
      .sort()
      .join('&');
  return pairs(got) === pairs(expected);
}

// ---- the fake X -----------------------------------------------------------------------------

/** A small deterministic number from a string, for plausible counts and ids. */
function hash(text) {
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619) >>> 0;
  return h;
}

const isoDate = (seed) => new Date(Date.UTC(2009, 0, 1) + (seed % 500_000_000) * 1000).toISOString();

/** An X v2 user with the fields perch asks for, derived from its id (and username when asked by one). */
function xUser(id, username = `u${id}`.slice(0, 15)) {
  const h = hash(id);
  return {
    id,
    username,
    name: `Bench User ${id}`,
    created_at: isoDate(h),
    description: `perch bench user ${id}`,
    location: '',
    profile_image_url: `https://pbs.twimg.com/profile_images/${id}/bench_normal.jpg`,
    protected: false,
    public_metrics: { followers_count: h % 100_000, following_count: h % 2_000, tweet_count: h % 50_000, listed_count: h % 500, like_count: h % 9_000, media_count: h % 300 },
    verified: false,
  };
}

/** A username's user: its id derived from it (ten digits), its username as asked. */
const xUserByName = (username) => xUser(String(7_000_000_000 + (hash(username.toLowerCase()) % 1_000_000_000)), username);

/** A tweet and its author (one of 97 per run), as `tweet.fields` and `expansions=author_id` give them. */
function xTweet(id) {
  const h = hash(id);
  const author = String(2_000_000_000 + (h % 97));
  return {
    tweet: {
      id,
      text: `bench tweet ${id}: caching proxies spare the provider &amp; its quota`,
      author_id: author,
      created_at: isoDate(h),
      edit_history_tweet_ids: [id],
      public_metrics: { retweet_count: h % 100, reply_count: h % 30, like_count: h % 1_000, quote_count: h % 10, bookmark_count: h % 20, impression_count: h % 100_000 },
    },
    author: { id: author, name: `Bench Author ${author}`, username: `a${author}`, profile_image_url: `https://pbs.twimg.com/profile_images/${author}/a_normal.jpg` },
  };
}

const authorsOf = (pairs) => [...new Map(pairs.map((p) => [p.author.id, p.author])).values()];

/** Which endpoint a path is, whether it is a batch, and its items (ids or usernames). */
function route(url) {
  const { pathname, searchParams } = url;
  let m;
  if ((m = /^\/2\/users\/by\/username\/([A-Za-z0-9_]+)$/.exec(pathname))) return { endpoint: 'user_by_username', batch: false, items: [m[1]] };
  if (pathname === '/2/users/by') return { endpoint: 'user_by_username', batch: true, items: (searchParams.get('usernames') ?? '').split(',').filter(Boolean) };
  if ((m = /^\/2\/users\/([0-9]+)$/.exec(pathname))) return { endpoint: 'user', batch: false, items: [m[1]] };
  if (pathname === '/2/users') return { endpoint: 'user', batch: true, items: (searchParams.get('ids') ?? '').split(',').filter(Boolean) };
  if ((m = /^\/2\/tweets\/([0-9]+)$/.exec(pathname))) return { endpoint: 'tweet', batch: false, items: [m[1]] };
  if (pathname === '/2/tweets') return { endpoint: 'tweet', batch: true, items: (searchParams.get('ids') ?? '').split(',').filter(Boolean) };
  return { endpoint: 'unknown', batch: false, items: [] };
}

/** The body X answers for a call (status 200), or undefined for a path it does not serve. */
function answer({ endpoint, batch, items }) {
  if (endpoint === 'user') return batch ? { data: items.map((id) => xUser(id)) } : { data: xUser(items[0]) };
  if (endpoint === 'user_by_username') return batch ? { data: items.map(xUserByName) } : { data: xUserByName(items[0]) };
  if (endpoint === 'tweet') {
    const pairs = items.map(xTweet);
    return batch ? { data: pairs.map((p) => p.tweet), includes: { users: authorsOf(pairs) } } : { data: pairs[0].tweet, includes: { users: [pairs[0].author] } };
  }
  return undefined;
}

/**
 * X's API v2 for user, username and tweet lookups, single and batched, in this process: every
 * call answered after ANSWER_MS with X's shapes (401 without the bench's bearer token, 400 for a
 * batch of more than 100 items as X does, 404 for any other path). Records each call: time (ms
 * since `t0`), path, endpoint, batch or not, items, whether its query carried the single
 * lookup's field parameters (null when unchecked), status.
 */
export async function startFakeX(expected) {
  const calls = [];
  const fake = { calls, t0: performance.now() };
  const server = createServer((req, res) => {
    const at = performance.now() - fake.t0;
    const url = new URL(req.url ?? '/', 'http://x');
    const r = route(url);
    const call = { at, path: req.url, endpoint: r.endpoint, batch: r.batch, items: r.items.length, queryOk: expected?.[r.endpoint] ? sameQuery(url.searchParams, expected[r.endpoint]) : null, status: 200 };
    let body;
    if (req.headers.authorization !== `Bearer ${TOKEN}`) {
      call.status = 401;
      body = { title: 'Unauthorized', type: 'about:blank', status: 401, detail: 'Unauthorized' };
    } else if (r.batch && (r.items.length < 1 || r.items.length > 100)) {
      call.status = 400;
      body = { errors: [{ parameters: { ids: [url.searchParams.get('ids') ?? url.searchParams.get('usernames')] }, message: 'size must be between 1 and 100' }], title: 'Invalid Request', detail: 'One or more parameters to your request was invalid.', type: 'https://api.twitter.com/2/problems/invalid-request' };
    } else {
      body = answer(r);
      if (body === undefined) {
        call.status = 404;
        body = { errors: [{ message: 'The requested resource could not be found.' }], title: 'Not Found Error', type: 'https://api.twitter.com/2/problems/resource-not-found' };
      }
    }
    calls.push(call);
    const bytes = Buffer.from(JSON.stringify(body));
    setTimeout(() => {
      res.writeHead(call.status, { 'content-type': 'application/json; charset=utf-8', 'content-length': bytes.length });
      res.end(bytes);
    }, ANSWER_MS);
  });
  server.keepAliveTimeout = 60_000;
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  fake.url = `http://127.0.0.1:${server.address().port}`;
  fake.reset = () => {
    calls.length = 0;
    fake.t0 = performance.now();
  };
  fake.close = () => new Promise((resolve) => (server.closeAllConnections(), server.close(resolve)));
  return fake;
}

// ---- perch ----------------------------------------------------------------------------------

function config(port, xUrl, { cap, batch }) {
  return `server: { host: 127.0.0.1, port: ${port} }
auth:
  keys:
${KEYS.map(({ id, key }) => `    - { id: ${id}, key: "${key}", plan: huge }`).join('\n')}
rate_limits:
  huge: { capacity: 1000000000, refill_per_second: 1000000000 }
upstreams:
  x: { kind: x_v2, url: "${xUrl}", bearer_token: "${TOKEN}", max_requests_per_second: ${cap}, timeout_ms: 5000${batch ? `, batch: ${batch}` : ''} }
cache:
  ttl_seconds: { user: 86400, user_by_username: 86400, tweet: 86400 }
log:
  level: info
`;
}

/** Prometheus text to `{ name, labels, value }` series. */
function parseMetrics(text) {
  const series = [];
  for (const line of text.split('\n')) {
    const m = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    series.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return series;
}

async function scrapeMetrics(url) {
  try {
    const res = await request(`${url}/metrics`, { headersTimeout: 5000, bodyTimeout: 5000 });
    const text = await res.body.text();
    return res.statusCode === 200 ? parseMetrics(text) : undefined;
  } catch {
    return undefined;
  }
}

const sumOf = (series, name, match = {}) => series.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v)).reduce((n, s) => n + s.value, 0);

/** perch's own view of batching: its batch-size histogram and the calls batching saved, when it has them. */
function batchMetrics(series, endpoint) {
  if (series === undefined) return { text: 'no /metrics' };
  const refused = {};
  for (const s of series) if (s.name === 'perch_upstream_refused_total' && s.value > 0) refused[s.labels.reason] = (refused[s.labels.reason] ?? 0) + s.value;
  if (!series.some((s) => s.name.startsWith('perch_upstream_batch_size'))) return { text: 'not exposed', refused };
  const batches = sumOf(series, 'perch_upstream_batch_size_count', { upstream: 'x', route: endpoint });
  const items = sumOf(series, 'perch_upstream_batch_size_sum', { upstream: 'x', route: endpoint });
  const saved = sumOf(series, 'perch_key_upstream_calls_saved_total', { reason: 'batched' });
  return { batches, items, saved, refused, text: `${batches} batches, mean ${fmt(items / batches, 1)} items; ${saved} calls saved` };
}

/** The access log's `batch` field over a route's lines: how many lines carry it, with a number. */
function logBatchField(logPath, endpoint) {
  if (!logPath || logPath === '/dev/null' || !existsSync(logPath)) return 'log not kept';
  let lines = 0;
  let withField = 0;
  let batched = 0;
  let max = 0;
  for (const text of readFileSync(logPath, 'utf8').split('\n')) {
    if (!text.includes('"msg":"request"')) continue;
    let line;
    try {
      line = JSON.parse(text);
    } catch {
      continue;
    }
    if (line.route !== endpoint) continue;
    lines++;
    if (!('batch' in line)) continue;
    withField++;
    if (typeof line.batch === 'number') {
      batched++;
      max = Math.max(max, line.batch);
    }
  }
  if (withField === 0) return lines === 0 ? 'no lines' : 'no field';
  return `${batched} of ${lines} lines batched (largest ${max})`;
}

// ---- phases ---------------------------------------------------------------------------------

const sorted = (values) => [...values].sort((a, b) => a - b);
const statusCounts = (results) => results.reduce((t, r) => ({ ...t, [r.status]: (t[r.status] ?? 0) + 1 }), {});

/** The provider calls a phase made, summed up: how many, items per call, how many carried the single lookup's query. */
function callSummary(calls) {
  const items = sorted(calls.map((c) => c.items));
  const checked = calls.filter((c) => c.queryOk !== null);
  return {
    calls: calls.length,
    batchCalls: calls.filter((c) => c.batch).length,
    itemsMin: items[0] ?? NaN,
    itemsMedian: percentile(items, 50),
    itemsMax: items.at(-1) ?? NaN,
    queryOff: checked.filter((c) => !c.queryOk).length,
    queryChecked: checked.length,
    callStatuses: statusCounts(calls),
    firstQueryOff: checked.find((c) => !c.queryOk)?.path,
  };
}

/** The fake's answers other than 200 (a path it does not serve, a batch over 100, no token), if any. */
const callTrouble = (r) => (Object.keys(r.callStatuses).some((s) => s !== '200') ? `, X answered ${JSON.stringify(r.callStatuses)}` : '');

async function loadPhase(ctx, phase, variant, built, expected) {
  const fake = await startFakeX(expected);
  const perch = await startPerchYaml(ctx, `perch-batch-${phase.id}-${variant.id}`, (port) => config(port, fake.url, { cap: CAP, batch: batchYaml(variant, built) }));
  let sent;
  let metrics;
  try {
    fake.reset();
    sent = await issueAtRate({
      target: perch.url,
      ratePerSecond: phase.count / SECONDS,
      seconds: SECONDS,
      pathOf: phase.pathOf,
      headersOf: (i) => ({ 'x-api-key': KEYS[i % KEYS.length].key }),
    });
    metrics = await scrapeMetrics(perch.url);
  } finally {
    await perch.proc.stop();
    await fake.close();
  }
  const ok = sorted(sent.filter((r) => r.status === 200).map((r) => r.ms));
  const result = {
    phase: phase.id,
    variant: variant.id,
    misses: sent.length,
    okShare: ok.length / sent.length,
    statuses: statusCounts(sent),
    p50: percentile(ok, 50),
    p99: percentile(ok, 99),
    ...callSummary(fake.calls),
    metrics: batchMetrics(metrics, phase.endpoint),
    log: logBatchField(perch.logPath, phase.endpoint),
  };
  result.line = `${phase.id}, ${variant.name}: ${sent.length} misses, ${JSON.stringify(result.statuses)} (${(result.okShare * 100).toFixed(1)}% 200), ${result.calls} provider calls (${result.batchCalls} batch calls, items per call ${result.itemsMin}/${result.itemsMedian}/${result.itemsMax}${callTrouble(result)}), p50 ${fmt(result.p50, 1)} ms, p99 ${fmt(result.p99, 1)} ms of the 200s${Object.keys(result.metrics.refused ?? {}).length > 0 ? `, refused by perch ${JSON.stringify(result.metrics.refused)}` : ''}`;
  ctx.log(`  batch ${result.line}`);
  if (result.queryOff > 0) ctx.log(`  batch ${phase.id}, ${variant.name}: ${result.queryOff} of ${result.queryChecked} calls lack the single lookup's field parameters, e.g. ${result.firstQueryOff}`);
  return result;
}

/**
 * Lone misses, batching on and off side by side: both perches (each with its own fake) run at
 * once, and LONE_ROUNDS rounds of LONE user misses one after another alternate between them
 * (after one unmeasured miss each), the cap lifted so none waits for it. Per round: p50 and p99
 * of what a miss waited beyond the fake's 30 ms.
 */
async function loneRounds(ctx, variants, built, expected) {
  const sides = [];
  try {
    for (const variant of variants) {
      const fake = await startFakeX(expected);
      const perch = await startPerchYaml(ctx, `perch-batch-lone-${variant.id}`, (port) => config(port, fake.url, { cap: 1000, batch: batchYaml(variant, built) }));
      const pool = new Pool(perch.url, { connections: 1, pipelining: 1, headersTimeout: 10_000, bodyTimeout: 10_000 });
      sides.push({ variant, fake, perch, pool, results: [], rounds: [] });
    }
    let next = 0;
    const get = async (side) => {
      const i = next++;
      const t = performance.now();
      const res = await side.pool.request({ path: `/v1/users/${1_600_000_000 + i}`, method: 'GET', headers: { 'x-api-key': KEYS[i % KEYS.length].key } });
      await res.body.dump({ limit: 1 << 20 });
      return { status: res.statusCode, ms: performance.now() - t };
    };
    for (const side of sides) {
      await get(side); // the pools' connections, both sides
      side.fake.reset();
    }
    for (let round = 0; round < LONE_ROUNDS; round++) {
      // ABBA: each side goes first in every other round, so drift within a round favours neither.
      for (const side of round % 2 === 0 ? sides : [...sides].reverse()) {
        const results = [];
        for (let i = 0; i < LONE; i++) results.push(await get(side));
        const added = sorted(results.filter((r) => r.status === 200).map((r) => r.ms - ANSWER_MS));
        side.rounds.push({ addedP50: added.length > 0 ? percentile(added, 50) : NaN, addedP99: added.length > 0 ? percentile(added, 99) : NaN });
        side.results.push(...results);
      }
    }
  } finally {
    for (const side of sides) {
      await side.pool.close();
      await side.perch.proc.stop();
      await side.fake.close();
    }
  }
  const out = {};
  for (const side of sides) {
    const median = (field) => sorted(side.rounds.map((r) => r[field]))[Math.floor(side.rounds.length / 2)];
    const result = { variant: side.variant.id, misses: side.results.length, statuses: statusCounts(side.results), okShare: side.results.filter((r) => r.status === 200).length / side.results.length, rounds: side.rounds, addedP50: median('addedP50'), addedP99: median('addedP99'), ...callSummary(side.fake.calls) };
    result.singleCalls = side.fake.calls.filter((c) => !c.batch && c.items === 1).length;
    result.line = `lone misses, ${side.variant.name}: ${LONE_ROUNDS} rounds of ${LONE} one at a time, ${JSON.stringify(result.statuses)}, ${result.calls} provider calls (${result.singleCalls} to the single endpoint${callTrouble(result)}), added p50 per round ${side.rounds.map((r) => fmt(r.addedP50, 2)).join(' / ')} ms, p99 ${side.rounds.map((r) => fmt(r.addedP99, 2)).join(' / ')} ms`;
    ctx.log(`  batch ${result.line}`);
    out[side.variant.id] = result;
  }
  return out;
}

export async function batchScenario(ctx) {
  const built = batchBuilt(ctx.repoRoot);
  const expected = await singleQueries(ctx.repoRoot);
  const notBuilt = 'not built (no file under dist/src names `max_items`; BENCH_BATCH_BUILT=1 runs it anyway)';
  const variants = built ? VARIANTS : VARIANTS.filter((v) => v.id === 'off');
  ctx.log(`  batch: batch lookups ${built ? `built (on: batch: ${batchYaml(VARIANTS[0], true)})` : 'not built: the unbatched variant only, without a `batch` key'}`);
  const runs = {};
  for (const phase of PHASES) for (const variant of variants) runs[`${phase.id}.${variant.id}`] = await loadPhase(ctx, phase, variant, built, expected);
  const lone = await loneRounds(ctx, variants, built, expected);
  for (const variant of variants) runs[`lone.${variant.id}`] = lone[variant.id];

  const atLeast = (min) => ({ text: `>= ${min}`, pass: (v) => v >= min });
  const atMost = (max) => ({ text: `<= ${max}`, pass: (v) => v <= max });
  const added = (r, field) => (r ? r[field] - ANSWER_MS : NaN);
  const figures = [];
  for (const phase of PHASES) {
    const on = runs[`${phase.id}.on`];
    const off = runs[`${phase.id}.off`];
    const what = `${phase.count} ${phase.what} in ${SECONDS} s, cap ${CAP}/s`;
    const gone = on ? {} : { unavailable: notBuilt };
    figures.push(
      { id: `batch.${phase.id}.ok`, label: `share answered 200, ${what}, batched`, runs: on ? [on.okShare] : [], target: atLeast(0.99), decimals: 3, baseline: { label: 'unbatched', runs: [off.okShare] }, ...gone },
      { id: `batch.${phase.id}.calls`, label: `provider calls, ${what}, batched`, runs: on ? [on.calls] : [], target: atMost(phase.maxCalls), decimals: 0, baseline: { label: 'unbatched', runs: [off.calls] }, ...gone },
      { id: `batch.${phase.id}.added.p50`, label: `added latency p50 of the 200s (ms, minus X's ${ANSWER_MS} ms), ${what}, batched`, runs: on ? [added(on, 'p50')] : [], decimals: 1, baseline: { label: 'unbatched', runs: [added(off, 'p50')] }, ...gone },
      { id: `batch.${phase.id}.added.p99`, label: `added latency p99 of the 200s (ms), ${what}, batched`, runs: on ? [added(on, 'p99')] : [], decimals: 1, baseline: { label: 'unbatched', runs: [added(off, 'p99')] }, ...gone },
      { id: `batch.${phase.id}.off.ok`, label: `share answered 200, ${what}, unbatched (today)`, runs: [off.okShare], decimals: 3 },
      { id: `batch.${phase.id}.off.calls`, label: `provider calls, ${what}, unbatched (today)`, runs: [off.calls], decimals: 0 },
    );
  }
  const loneOn = runs['lone.on'];
  const loneOff = runs['lone.off'];
  for (const p of ['p50', 'p99']) {
    const field = p === 'p50' ? 'addedP50' : 'addedP99';
    figures.push({ id: `batch.lone.${p}`, label: `lone miss, added latency ${p} (ms, minus X's ${ANSWER_MS} ms), batched`, runs: loneOn ? loneOn.rounds.map((r) => r[field]) : [], decimals: 2, baseline: { label: 'unbatched', runs: loneOff.rounds.map((r) => r[field]) }, ...(loneOn ? {} : { unavailable: notBuilt }) });
  }

  const rows = [];
  for (const phase of PHASES) {
    for (const variant of VARIANTS) {
      const r = runs[`${phase.id}.${variant.id}`];
      if (!r) {
        rows.push([phase.id, variant.name, 'not built', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-']);
        continue;
      }
      rows.push([
        phase.id,
        variant.name,
        String(r.misses),
        fmt(r.okShare, 3),
        JSON.stringify(r.statuses),
        `${r.calls} (${r.batchCalls} batch)${callTrouble(r)}`,
        `${r.itemsMin} / ${r.itemsMedian} / ${r.itemsMax}`,
        fmt(r.p50, 1),
        fmt(r.p99, 1),
        `${fmt(r.p50 - ANSWER_MS, 1)} / ${fmt(r.p99 - ANSWER_MS, 1)}`,
        r.queryChecked === 0 ? '-' : r.queryOff === 0 ? 'yes' : `${r.queryOff} of ${r.queryChecked} differ`,
        r.metrics.text,
        r.log,
      ]);
    }
  }
  for (const variant of VARIANTS) {
    const r = runs[`lone.${variant.id}`];
    if (!r) {
      rows.push(['lone', variant.name, 'not built', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-']);
      continue;
    }
    rows.push(['lone', variant.name, String(r.misses), fmt(r.okShare, 3), JSON.stringify(r.statuses), `${r.calls} (${r.singleCalls} single)${callTrouble(r)}`, `${r.itemsMin} / ${r.itemsMedian} / ${r.itemsMax}`, fmt(r.addedP50 + ANSWER_MS, 1), fmt(r.addedP99 + ANSWER_MS, 1), `${fmt(r.addedP50, 2)} / ${fmt(r.addedP99, 2)}`, r.queryChecked === 0 ? '-' : r.queryOff === 0 ? 'yes' : `${r.queryOff} of ${r.queryChecked} differ`, '-', '-']);
  }
  const table = {
    title: `Batch lookups (x_v2, cap ${CAP}/s burst ${CAP}, a fake X answering in ${ANSWER_MS} ms, 5 keys in turn; ${SECONDS} s open loop per phase; lone: ${LONE_ROUNDS} interleaved rounds of ${LONE} misses one at a time, cap 1000/s)`,
    head: ['phase', 'variant', 'misses', '200 share', 'statuses', 'provider calls', 'items per call min / median / max', 'p50 ms (200s)', 'p99 ms (200s)', 'added p50 / p99 ms', "single lookup's query", 'perch batch metrics', 'access log batch'],
    rows,
  };
  const notes = [
    `Batch lookups (issue 44; ${built ? 'batching built' : 'batching not in this build: only the unbatched variant ran, without a `batch` key'}): an x_v2 upstream capped at ${CAP} calls/s (burst ${CAP}, queue_timeout_ms 1000 by default) in front of a fake X answering every single and batch lookup in ${ANSWER_MS} ms; distinct misses open loop for ${SECONDS} s over 5 client keys in turn, a fresh perch and fake per phase and variant. ${Object.values(runs).map((r) => r.line).join('; ')}.`,
  ];
  if (expected === undefined) notes.push("Batch lookups: this build has no dist/src/upstream/x-v2/requests.js, so the calls' field parameters were not checked against the single lookups'.");
  return { figures, tables: [table], notes };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const ctx = standaloneContext({ repoRoot: perchRoot(), tmpPrefix: 'perch-bench-batch-' });
  const t0 = Date.now();
  const { figures, tables, notes } = await batchScenario(ctx);
  process.stdout.write(`\n${printTables(figures.map(evaluate), tables)}\n\n${notes.join('\n')}\n\n(${((Date.now() - t0) / 1000).toFixed(1)} s)\n`);
}
