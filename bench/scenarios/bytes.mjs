// Bytes (issue 23): what compression at store time and 304s buy on the hit path, paired in one
// run. One perch, one cached ~10 KB tweets page, three kinds of request driven by wrk in
// interleaved rounds against identity hits as the baseline: `Accept-Encoding: br, gzip` (perch
// sends its stored brotli variant), and `If-None-Match` with the page's tag (perch answers 304).
// The peers get the same `Accept-Encoding`: nginx proxy_cache with `gzip on` (level 1, so it
// compresses every response) and Varnish with `beresp.do_gzip` (it stores one gzip copy).
// Then what an entry holds: its bytes in Redis against the format before compression (a 24-byte
// header and the identity body), and what the memory tier charges it.
import { request } from 'undici';
import { BENCH_KEY, get, startPerch } from '../lib/perch.mjs';
import { nginxVersion, startNginx } from '../lib/nginx.mjs';
import { redisAvailable, redisCommand, startRedis } from '../lib/redis.mjs';
import { side, targetsTable } from '../lib/report.mjs';
import { hitRounds } from '../lib/hit-rounds.mjs';
import { startUpstream } from '../lib/servers.mjs';
import { startVarnish, varnishVersion } from '../lib/varnish.mjs';
import { HIT_PATH } from './hit.mjs';

const ACCEPT = 'br, gzip';

async function raw(url, headers = {}) {
  const res = await request(url + HIT_PATH, { headers: { 'x-api-key': BENCH_KEY, ...headers } });
  const body = Buffer.from(await res.body.arrayBuffer());
  return { status: res.statusCode, headers: res.headers, body };
}

/** GETs until the answer has a Content-Encoding (perch makes its variants just after the miss). */
async function primeCompressed(url, name) {
  for (let i = 0; i < 200; i++) {
    const res = await raw(url, { 'accept-encoding': ACCEPT });
    if (res.status !== 200) throw new Error(`${name} answered ${res.status}`);
    if (res.headers['content-encoding'] !== undefined) return res;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`${name} never answered ${ACCEPT} with a Content-Encoding`);
}

/** What the memory tier charges all its entries now (perch_cache_bytes{tier="memory"}). */
async function memoryCharge(url) {
  const metrics = (await get(url, '/metrics')).body.toString();
  return Number(/^perch_cache_bytes\{tier="memory"\} (\d+)/m.exec(metrics)?.[1] ?? 0);
}

export async function bytesScenario(ctx) {
  const { options } = ctx;
  const notes = [];
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const redis = redisAvailable() ? await startRedis(ctx) : undefined;
    if (redis) stops.push(redis.proc);
    const perch = await startPerch(ctx, 'perch-bytes', { upstreamUrl: upstream.url, ttl: { tweets: 3600 }, ...(redis ? { redisUrl: redis.url } : {}) });
    stops.push(perch.proc);
    const chargedBefore = await memoryCharge(perch.url);
    const identity = await raw(perch.url);
    const compressed = await primeCompressed(perch.url, 'perch');
    const tag = (await raw(perch.url)).headers.etag;
    const notModified = await raw(perch.url, { 'if-none-match': tag });
    if (notModified.status !== 304) throw new Error(`perch answered ${notModified.status} to If-None-Match with its own tag`);
    notes.push(
      `Bytes scenario page: identity ${identity.body.length} bytes; with Accept-Encoding "${ACCEPT}" perch sends ${compressed.headers['content-encoding']} ${compressed.body.length} bytes (${(compressed.body.length / identity.body.length).toFixed(3)}x the body).`,
    );

    const targets = [
      { name: 'identity', label: 'perch hit, identity', url: perch.url, pids: perch.pids, headers: {} },
      { name: 'compressed', label: `perch hit, Accept-Encoding: ${ACCEPT}`, url: perch.url, pids: perch.pids, headers: { 'accept-encoding': ACCEPT } },
      { name: 'revalidated', label: 'perch 304, If-None-Match', url: perch.url, pids: perch.pids, headers: { 'if-none-match': tag } },
    ];
    if (nginxVersion() !== null) {
      const ng = await startNginx(ctx, upstream.port, { gzip: true });
      stops.push(ng.proc);
      await raw(ng.url);
      const res = await raw(ng.url, { 'accept-encoding': ACCEPT });
      notes.push(`nginx gzip on (level 1): ${res.headers['content-encoding'] ?? 'identity'} ${res.body.length} bytes per page body.`);
      targets.push({ name: 'nginx-gzip', label: 'nginx proxy_cache, gzip on (level 1)', url: ng.url, pids: [ng.proc.pid], headers: { 'accept-encoding': ACCEPT } });
    } else notes.push('nginx: skipped, not on PATH.');
    if (varnishVersion() !== null) {
      const vn = await startVarnish(ctx, upstream.port, { gzip: true });
      stops.push(vn.proc);
      await raw(vn.url, { 'accept-encoding': ACCEPT });
      const res = await raw(vn.url, { 'accept-encoding': ACCEPT });
      notes.push(`Varnish with do_gzip (one stored gzip copy): ${res.headers['content-encoding'] ?? 'identity'} ${res.body.length} bytes per page body.`);
      targets.push({ name: 'varnish-gzip', label: 'Varnish, stored gzip', url: vn.url, pids: vn.pids, headers: { 'accept-encoding': ACCEPT } });
    } else notes.push('Varnish: skipped, not on PATH.');

    const results = await hitRounds(ctx, { targets, path: HIT_PATH, label: 'bytes', pairWith: 'identity' });

    const series = (name, field) => results[name].map((r) => r[field]);
    const cpuPerRequest = (r) => r.serverCpu / r.rps;
    const paired = (name, of) => results[name].map((r) => of(r) / of(r.baselineRun));
    const sides = (name) => [side(name, results[name]), side('identity', results.identity)];
    const figures = [
      {
        id: 'bytes.wire.compressed',
        label: `bytes on the wire per hit, Accept-Encoding: ${ACCEPT} (headers included)`,
        runs: series('compressed', 'bytesPerResponse'),
        baseline: { label: 'identity', runs: series('identity', 'bytesPerResponse') },
        target: { text: '<= 0.35x identity', pass: (v, b) => v / b <= 0.35 },
        decimals: 0,
      },
      {
        id: 'bytes.cpu.compressed',
        label: 'CPU per compressed hit (server CPU seconds per request, paired ratio)',
        runs: series('compressed', 'serverCpu').map((cpu, i) => (cpu / results.compressed[i].rps) * 1e6),
        baseline: { label: 'identity', runs: results.identity.map((r) => cpuPerRequest(r) * 1e6) },
        pairRatios: paired('compressed', cpuPerRequest),
        target: { text: '<= 1.0x identity (paired)', pass: (v, b, ratio) => ratio <= 1.0 },
        decimals: 2,
        sides: sides('compressed'),
        rule: 'throughput',
      },
      {
        id: 'bytes.cpu.revalidated',
        label: 'CPU per 304 (server CPU µs per request, paired ratio)',
        runs: series('revalidated', 'serverCpu').map((cpu, i) => (cpu / results.revalidated[i].rps) * 1e6),
        baseline: { label: 'identity', runs: results.identity.map((r) => cpuPerRequest(r) * 1e6) },
        pairRatios: paired('revalidated', cpuPerRequest),
        target: { text: '<= 0.7x identity (paired)', pass: (v, b, ratio) => ratio <= 0.7 },
        decimals: 2,
        sides: sides('revalidated'),
        rule: 'throughput',
      },
    ];

    if (redis) {
      const key = `perch:c:${HIT_PATH}`;
      const valueLength = Number(await redisCommand(redis.port, 'STRLEN', key));
      const before = 24 + identity.body.length;
      const usage = Number(await redisCommand(redis.port, 'MEMORY', 'USAGE', key));
      // The format before compression, written beside it, for Redis's own accounting of both.
      const oldKey = `${key}#format2`;
      await redisCommand(redis.port, 'SET', oldKey, 'x'.repeat(before));
      const oldUsage = Number(await redisCommand(redis.port, 'MEMORY', 'USAGE', oldKey));
      figures.push({
        id: 'bytes.redis',
        label: 'bytes per entry in Redis (value length; MEMORY USAGE in the note)',
        runs: [valueLength],
        baseline: { label: 'format 2: 24 + identity', value: before },
        target: { text: '<= 0.4x before', pass: (v, b) => v / b <= 0.4 },
        decimals: 0,
      });
      notes.push(`Redis MEMORY USAGE of the entry: ${usage} bytes; of a value the size of the format-2 entry (${before} bytes): ${oldUsage} bytes (${(usage / oldUsage).toFixed(3)}x).`);
    } else notes.push('Redis bytes: skipped, redis-server is not on PATH.');

    // The memory tier's own charge for the entry (perch_cache_bytes{tier="memory"}) against what
    // the same entry was charged before variants: body + key (UTF-16) + 640 bytes of overhead.
    const charged = (await memoryCharge(perch.url)) - chargedBefore;
    if (Number.isFinite(charged)) {
      figures.push({
        id: 'bytes.memory',
        label: 'bytes the memory tier charges the entry (identity + br + gzip + overheads)',
        runs: [charged],
        baseline: { label: 'identity + key + 640', value: identity.body.length + HIT_PATH.length * 2 + 640 },
        target: { text: '<= 1.5x before', pass: (v, b) => v / b <= 1.5 },
        decimals: 0,
      });
    } else notes.push('memory bytes: perch_cache_bytes not readable');

    return {
      figures,
      tables: [targetsTable({ title: `Bytes: hits by Accept-Encoding and 304s, ${options.connections} connections (medians over ${options.runs} rounds)`, targets, results, baseline: 'identity', rule: 'throughput' })],
      notes,
    };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
}
