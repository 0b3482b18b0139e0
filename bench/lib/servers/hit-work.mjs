// The work every perch hit must do, written as plainly as JavaScript allows, shared by the two
// plain bounds (minimal-path.mjs on node:http, raw-path.mjs on a bare socket): the key looked up
// in a Map, the URL matched by one regex, a token bucket refilled and spent, the entry found in a
// Map, a random request id, the per-request header values perch sends (cache-status with the TTL
// left, age, rate-limit fields, max-age, the entry's ETag and Last-Modified), three counters and
// a histogram bumped through nested Maps, and the access line built with one template and
// written in 64 KB batches to a file (perch's LineBatcher, the cheapest path measured).
import { randomUUID } from 'node:crypto';
import { openSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { bodyFactory } from '../bodies.mjs';
import { entityTag } from './hit-answer.mjs';

const ROUTE = /^\/v1\/users\/(\d{1,19})\/tweets$/;
const BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/**
 * `root`: the perch checkout whose LineBatcher to use; `logFile`: the access log. Returns
 * `serve(url, apiKey)`: the response's header pairs and body, or undefined for anything but the
 * cached page (the bounds answer that 404); `record(answer, method, url, remote, started)` to
 * count and log it once written; and `flushSync` for the end.
 */
export async function createHitWork({ root, logFile, userId, tweetsBytes }) {
  const { LineBatcher } = await import(pathToFileURL(join(root, 'dist', 'src', 'logging', 'line-batcher.js')).href);
  const log = new LineBatcher(openSync(logFile, 'a'));
  const body = bodyFactory({ tweetsBytes }).tweets(userId);
  const keys = new Map([['perch-bench-key-0123456789abcdef', { id: 'bench', capacity: 1e9, refill: 1e9 }]]);
  const storedAt = Date.now();
  // The validators are the entry's, made once when it is stored; a hit only sends them.
  const cache = new Map([[`/v1/users/${userId}/tweets`, { body, length: String(body.length), storedAt, ttlMs: 3_600_000, etag: entityTag(body), lastModified: new Date(storedAt).toUTCString() }]]);
  const buckets = new Map();
  const counts = new Map();
  const histogram = { counts: new Array(BUCKETS.length + 1).fill(0), sum: 0, count: 0 };

  function count(a, b, c) {
    let level = counts.get(a);
    if (level === undefined) counts.set(a, (level = new Map()));
    let inner = level.get(b);
    if (inner === undefined) level.set(b, (inner = new Map()));
    inner.set(c, (inner.get(c) ?? 0) + 1);
  }

  function serve(url, apiKey) {
    const client = keys.get(apiKey);
    const match = client === undefined ? null : ROUTE.exec(url);
    const entry = match === null ? undefined : cache.get(url);
    if (entry === undefined) return undefined;
    const now = Date.now();
    let bucket = buckets.get(client.id);
    if (bucket === undefined) buckets.set(client.id, (bucket = { tokens: client.capacity, at: now }));
    bucket.tokens = Math.min(client.capacity, bucket.tokens + ((now - bucket.at) * client.refill) / 1000) - 1;
    bucket.at = now;
    const age = Math.floor((now - entry.storedAt) / 1000);
    const ttl = Math.ceil((entry.storedAt + entry.ttlMs - now) / 1000);
    const id = randomUUID();
    const headers = [
      'cache-status', `perch; hit; ttl=${ttl}`,
      'age', String(age),
      'x-request-id', id,
      'ratelimit-policy', '"unlimited";q=1000000000;w=1',
      'ratelimit', `"unlimited";r=${Math.floor(bucket.tokens)};t=${Math.ceil((client.capacity - bucket.tokens) / client.refill)}`,
      'cache-control', `private, max-age=${age + ttl}`,
      'vary', 'X-API-Key',
      'etag', entry.etag,
      'last-modified', entry.lastModified,
      'content-type', 'application/json; charset=utf-8',
      'content-length', entry.length,
    ];
    return { headers, body: entry.body, id, now, keyId: client.id };
  }

  function record(answer, method, url, remote, started) {
    const ms = performance.now() - started;
    count('tweets', 200, 'hit');
    count(answer.keyId, 200, 'hit');
    let i = 0;
    while (i < BUCKETS.length && ms / 1000 > BUCKETS[i]) i++;
    histogram.counts[i]++;
    histogram.sum += ms / 1000;
    histogram.count++;
    log.write(
      `{"level":30,"time":${answer.now},"service":"perch","req_id":"${answer.id}","method":"${method}","path":"${url}","route":"tweets","status":200,"cache":"hit","upstream":null,"upstream_ms":null,"ms":${Math.round(ms * 100) / 100},"key_id":"${answer.keyId}","remote":"${remote}","user_agent":null,"msg":"request"}\n`,
    );
  }

  return { serve, record, flushSync: () => log.flushSync() };
}

/**
 * `createHitWork` as the bound scripts are started (lib/servers.mjs): PERCH_ROOT, required, names
 * the perch checkout; LOG_FILE the access log (default /dev/null); HIT_USER_ID and TWEETS_BYTES
 * the page.
 */
export function hitWorkFromEnv(env = process.env) {
  if (!env.PERCH_ROOT) throw new Error('PERCH_ROOT is not set');
  return createHitWork({
    root: env.PERCH_ROOT,
    logFile: env.LOG_FILE ?? '/dev/null',
    userId: env.HIT_USER_ID ?? '1000000000000000001',
    tweetsBytes: Number(env.TWEETS_BYTES ?? 10240),
  });
}
