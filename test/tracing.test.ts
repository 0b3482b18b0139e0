import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { test, type TestContext } from 'node:test';
import { startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from './helpers/otlp-receiver.js';
import { KEY, pollFor, startPerch, testConfig, v1, type RunningPerch } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { leakedFragments, secretsOf } from './helpers/secret-scan.js';
import { json, sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';
import { xFixtureText } from './helpers/x-v2-fixtures.js';

/** Secrets with no run of six hex digits, so the scan checks every fragment of them. */
const PROVIDER_SECRET = 'prov-secret-QzWxPm-kRtLvN';
const COLLECTOR_TOKEN = 'coll-token-JhYuGt-wSqPzM';
const X_TOKEN = 'xtok-RvNmLq-TgWsPz';

const SERVER = 2;
const CLIENT = 3;
const INTERNAL = 1;
const ERROR = 2;

function tracing(receiver: OtlpReceiver, extra = ''): string {
  return `tracing: { endpoint: "${receiver.url}", headers: { Authorization: "Bearer ${COLLECTOR_TOKEN}" }${extra} }`;
}

/** perch with tracing to a local receiver; its spans leave every 10 ms. */
async function traced(t: TestContext, yaml: string): Promise<RunningPerch> {
  const perch = await startPerch(t, yaml, { traceExportDelayMs: 10 });
  return perch;
}

/** Waits until the receiver holds `count` spans of `traceId`. */
function spansOf(receiver: OtlpReceiver, traceId: string, count: number): Promise<ReceivedSpan[]> {
  return pollFor(() => {
    const spans = receiver.spans.filter((s) => s.traceId === traceId);
    return spans.length >= count ? spans : undefined;
  });
}

/** The access lines, oldest first. */
function accessLines(perch: RunningPerch): Record<string, any>[] {
  return perch.logs.lines().filter((l) => l.msg === 'request');
}

function childrenOf(spans: readonly ReceivedSpan[], parent: ReceivedSpan): ReceivedSpan[] {
  return spans.filter((s) => s.parentSpanId === parent.spanId);
}

/** No fragment of any configured or presented secret in any exported attribute or resource. */
function assertNoSecrets(receiver: OtlpReceiver, yaml: string): void {
  const exported = JSON.stringify(receiver.spans.map((s) => [s.name, s.attributes, s.resource, s.status]));
  assert.deepEqual(leakedFragments(exported, [...secretsOf(yaml, {}), KEY]), []);
}

test('a miss: a server span named after the route, with the provider queue and one attempt under it; the provider is handed the trace', { timeout: 20_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = testConfig(v1('main', upstream.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }`), tracing(receiver));
  const perch = await traced(t, yaml);
  assert.equal((await perch.request('/v1/users/12', { headers: { 'user-agent': 'trace-test' } })).status, 200);

  const [line] = accessLines(perch);
  assert.match(line!.trace_id, /^[0-9a-f]{32}$/);
  assert.match(line!.span_id, /^[0-9a-f]{16}$/);
  const spans = await spansOf(receiver, line!.trace_id, 3);
  const server = spans.find((s) => s.kind === SERVER)!;
  assert.equal(server.spanId, line!.span_id, 'the access line names the server span');
  assert.equal(server.parentSpanId, '', 'a new trace');
  assert.equal(server.name, 'GET /v1/users/{user_id}');
  assert.deepEqual(
    {
      method: server.attributes['http.request.method'],
      route: server.attributes['http.route'],
      path: server.attributes['url.path'],
      status: server.attributes['http.response.status_code'],
      cache: server.attributes['perch.cache'],
      key: server.attributes['perch.key_id'],
      upstream: server.attributes['perch.upstream'],
      requestId: server.attributes['perch.request_id'],
      agent: server.attributes['user_agent.original'],
    },
    { method: 'GET', route: '/v1/users/{user_id}', path: '/v1/users/12', status: 200, cache: 'miss', key: 'alpha', upstream: 'main', requestId: line!.req_id, agent: 'trace-test' },
  );
  assert.equal(server.status.code, 0);
  assert.equal(server.resource['service.name'], 'perch');

  const children = childrenOf(spans, server);
  assert.deepEqual(children.map((s) => [s.name, s.kind]).sort(), [['GET', CLIENT], ['provider queue', INTERNAL]]);
  const queue = children.find((s) => s.name === 'provider queue')!;
  assert.equal(queue.attributes['perch.queue.admission'], 'admitted');
  assert.equal(queue.attributes['perch.upstream'], 'main');
  const attempt = children.find((s) => s.kind === CLIENT)!;
  assert.deepEqual(
    [attempt.attributes['perch.upstream'], attempt.attributes['perch.retry'], attempt.attributes['perch.credential_id'], attempt.attributes['perch.outcome'], attempt.attributes['server.address']],
    ['main', 0, 'default', 'ok', '127.0.0.1'],
  );
  assert.equal(attempt.status.code, 0);

  // The provider's own spans hang under the attempt's.
  assert.equal(upstream.requests[0]!.headers.traceparent, `00-${server.traceId}-${attempt.spanId}-01`);
  // Every export carries the configured headers, to the signal's path of the base URL.
  assert.ok(receiver.exports.length > 0);
  assert.ok(receiver.exports.every((h) => h.authorization === `Bearer ${COLLECTOR_TOKEN}`));
  assert.deepEqual(receiver.strays, []);
  assertNoSecrets(receiver, yaml);
});

test(`a hit: one server span, no children; an incoming traceparent is continued, its tracestate dropped`, { timeout: 20_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = testConfig(v1('main', upstream.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }`), tracing(receiver, ', sample_ratio: 0'));
  const perch = await traced(t, yaml);
  const callerTrace = '4bf92f3577b34da6a3ce929d0e0e4736';
  const callerSpan = '00f067aa0ba902b7';
  const sampled = { traceparent: `00-${callerTrace}-${callerSpan}-01`, tracestate: 'vendor=opaque' };
  // sample_ratio 0 samples no new trace, but a caller's sampled one is followed.
  assert.equal((await perch.request('/v1/users/7', { headers: sampled })).status, 200);
  const hitTrace = 'aaaabbbbccccdddd0000111122223333';
  assert.equal((await perch.request('/v1/users/7', { headers: { traceparent: `00-${hitTrace}-${callerSpan}-01` } })).status, 200);

  const [miss, hit] = accessLines(perch);
  assert.equal(miss!.trace_id, callerTrace);
  assert.equal(hit!.trace_id, hitTrace);
  const missSpans = await spansOf(receiver, callerTrace, 3);
  const server = missSpans.find((s) => s.kind === SERVER)!;
  assert.equal(server.parentSpanId, callerSpan);
  const attempt = missSpans.find((s) => s.kind === CLIENT)!;
  assert.equal(upstream.requests[0]!.headers.traceparent, `00-${callerTrace}-${attempt.spanId}-01`);
  // The caller's vendors' data is not the provider's business unless the operator says so.
  assert.equal(upstream.requests[0]!.headers.tracestate, undefined);

  const [hitSpan] = await spansOf(receiver, hitTrace, 1);
  assert.equal(hitSpan!.kind, SERVER);
  assert.equal(hitSpan!.spanId, hit!.span_id);
  assert.equal(hitSpan!.attributes['perch.cache'], 'hit');
  assert.equal(hitSpan!.attributes['perch.key_id'], 'alpha');
  assert.equal(hitSpan!.attributes['perch.upstream'], undefined);
  assert.deepEqual(childrenOf(receiver.spans, hitSpan!), []);

  // An unsampled caller: nothing exported, but the ids are still logged and handed on, unsampled.
  const unsampledTrace = '0123456789abcdef0123456789abcdef';
  assert.equal((await perch.request('/v1/users/8', { headers: { traceparent: `00-${unsampledTrace}-${callerSpan}-00` } })).status, 200);
  assert.equal(accessLines(perch)[2]!.trace_id, unsampledTrace);
  assert.match(String(upstream.requests[1]!.headers.traceparent), new RegExp(`^00-${unsampledTrace}-[0-9a-f]{16}-00$`));
  // A new trace at sample_ratio 0: logged with its ids, never exported.
  await perch.request('/v1/users/9');
  const fresh = accessLines(perch)[3]!;
  assert.match(fresh.trace_id, /^[0-9a-f]{32}$/);
  await perch.request('/v1/users/7', { headers: { traceparent: `00-${'f'.repeat(31)}e-${callerSpan}-01` } });
  await spansOf(receiver, `${'f'.repeat(31)}e`, 1);
  assert.equal(receiver.spans.filter((s) => s.traceId === unsampledTrace || s.traceId === fresh.trace_id).length, 0);
  assertNoSecrets(receiver, yaml);
});

test(`tracing.client_tracestate: true hands an accepted caller's tracestate on to the provider`, { timeout: 20_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = testConfig(v1('main', upstream.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }`), tracing(receiver, ', client_tracestate: true'));
  const perch = await traced(t, yaml);
  const traceparent = `00-${'4bf92f3577b34da6a3ce929d0e0e4736'}-00f067aa0ba902b7-01`;
  assert.equal((await perch.request('/v1/users/7', { headers: { traceparent, tracestate: 'vendor=opaque' } })).status, 200);
  assert.equal(upstream.requests[0]!.headers.tracestate, 'vendor=opaque');
});

test(`a caller's traceparent counts only once its key is accepted: a 401 or a key the provider has not verified starts a trace of perch's own`, { timeout: 20_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const good = 'ck-trace-good-0123456789';
  const upstream = await startUpstream(t, (req, res) => (req.headers['x-api-key'] === good ? sampleProvider(req, res) : json(401, { title: 'Unauthorized' })(req, res)));
  const yaml = `
server: { host: 127.0.0.1, port: 0 }
auth: { mode: upstream, default_plan: resale }
rate_limits: { resale: { capacity: 1000, refill_per_second: 1000 } }
upstreams: { main: { kind: v1, url: "${upstream.url}", timeout_ms: 2000, propagate_trace: true } }
${tracing(receiver, ', sample_ratio: 0')}
`;
  const perch = await traced(t, yaml);
  const callerTrace = '4bf92f3577b34da6a3ce929d0e0e4736';
  const sampled = { traceparent: `00-${callerTrace}-00f067aa0ba902b7-01` };
  // No key, then a key the provider has not seen: neither joins the caller's trace nor is recorded.
  assert.equal((await perch.request('/v1/users/7', { key: null, headers: sampled })).status, 401);
  assert.equal((await perch.request('/v1/users/7', { key: good, headers: sampled })).status, 200);
  const [noKey, unverified] = accessLines(perch);
  assert.notEqual(noKey!.trace_id, callerTrace);
  assert.notEqual(unverified!.trace_id, callerTrace);
  assert.doesNotMatch(String(upstream.requests[0]!.headers.traceparent), new RegExp(callerTrace));
  // The provider has accepted the key: now its caller's trace is continued, and sampled.
  assert.equal((await perch.request('/v1/users/7', { key: good, headers: sampled })).status, 200);
  assert.equal(accessLines(perch)[2]!.trace_id, callerTrace);
  await spansOf(receiver, callerTrace, 1);
  assert.equal(receiver.spans.filter((s) => s.traceId === noKey!.trace_id || s.traceId === unverified!.trace_id).length, 0);
});

test('a coalesced miss: the leader\'s span has the attempt, the follower\'s none', { timeout: 20_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const held: ServerResponse[] = [];
  const upstream = await startUpstream(t, (_req, res) => held.push(res));
  const yaml = testConfig(v1('main', upstream.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }`), tracing(receiver));
  const perch = await traced(t, yaml);
  const first = perch.request('/v1/users/3');
  const second = perch.request('/v1/users/3');
  await pollFor(() => (held.length === 1 && perch.received() === 2 ? true : undefined));
  sampleProvider(upstream.requests[0] as never, held[0]!);
  assert.deepEqual([(await first).status, (await second).status], [200, 200]);

  const lines = accessLines(perch);
  const leader = lines.find((l) => l.cache === 'miss')!;
  const follower = lines.find((l) => l.cache === 'coalesced')!;
  assert.notEqual(leader.trace_id, follower.trace_id);
  const leaderSpans = await spansOf(receiver, leader.trace_id, 3);
  const [followerSpan] = await spansOf(receiver, follower.trace_id, 1);
  assert.equal(followerSpan!.attributes['perch.cache'], 'coalesced');
  assert.deepEqual(childrenOf(receiver.spans, followerSpan!), []);
  const leaderServer = leaderSpans.find((s) => s.kind === SERVER)!;
  assert.equal(leaderServer.attributes['perch.cache'], 'miss');
  assert.equal(childrenOf(leaderSpans, leaderServer).filter((s) => s.kind === CLIENT).length, 1);
  assert.equal(upstream.requests.length, 1);
  assertNoSecrets(receiver, yaml);
});

test('a retry: one attempt span per call, numbered, the failed one marked with its status, each handed its own parent id', { timeout: 20_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  let calls = 0;
  const behaviour: UpstreamBehaviour = (req, res) => (calls++ === 0 ? json(503, { detail: 'provider-body-text' })(req, res) : sampleProvider(req, res));
  const upstream = await startUpstream(t, behaviour);
  const yaml = testConfig(v1('main', upstream.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }, retries: 1, retry_backoff_ms: 1, retry_budget_percent: 100`), tracing(receiver));
  const perch = await traced(t, yaml);
  assert.equal((await perch.request('/v1/users/5')).status, 200);

  const [line] = accessLines(perch);
  const spans = await spansOf(receiver, line!.trace_id, 5);
  const server = spans.find((s) => s.kind === SERVER)!;
  const attempts = childrenOf(spans, server)
    .filter((s) => s.kind === CLIENT)
    .sort((a, b) => Number(a.attributes['perch.retry']) - Number(b.attributes['perch.retry']));
  assert.equal(childrenOf(spans, server).filter((s) => s.name === 'provider queue').length, 2, 'every call passes the guard');
  assert.deepEqual(
    attempts.map((s) => [s.attributes['perch.retry'], s.attributes['http.request.resend_count'], s.attributes['perch.outcome'], s.attributes['http.response.status_code'], s.attributes['error.type'], s.status.code]),
    [
      [0, undefined, 'status_5xx', 503, 'status_5xx', ERROR],
      [1, 1, 'ok', undefined, undefined, 0],
    ],
  );
  assert.deepEqual(
    upstream.requests.map((r) => r.headers.traceparent),
    attempts.map((s) => `00-${server.traceId}-${s.spanId}-01`),
  );
  assert.equal(server.status.code, 0, 'the request itself succeeded');
  assert.ok(!JSON.stringify(receiver.spans).includes('provider-body-text'), 'no upstream body in any span');
  assertNoSecrets(receiver, yaml);
});

test('an upstream 429: the attempt span records the status and the outcome, never the body; the client\'s 429 is not perch\'s error', { timeout: 20_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const upstream = await startUpstream(t, json(429, { title: 'Too Many Requests', detail: 'provider-body-text' }, { 'retry-after': '30' }));
  const yaml = testConfig(v1('main', upstream.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }`), tracing(receiver));
  const perch = await traced(t, yaml);
  assert.equal((await perch.request('/v1/users/6')).status, 429);

  const [line] = accessLines(perch);
  const spans = await spansOf(receiver, line!.trace_id, 3);
  const server = spans.find((s) => s.kind === SERVER)!;
  assert.deepEqual([server.attributes['http.response.status_code'], server.attributes['perch.cache'], server.status.code], [429, 'miss', 0]);
  const attempt = childrenOf(spans, server).find((s) => s.kind === CLIENT)!;
  assert.deepEqual(
    [attempt.attributes['http.response.status_code'], attempt.attributes['perch.outcome'], attempt.attributes['perch.credential_id'], attempt.status.code, attempt.status.message],
    [429, 'rate_limited', 'default', ERROR, 'rate_limited'],
  );
  assert.ok(!JSON.stringify(receiver.spans).includes('provider-body-text'), 'no upstream body in any span');
  assertNoSecrets(receiver, yaml);
});

test('propagation follows propagate_trace: on by default for v1, off by default for x_v2, either way when set', { timeout: 20_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const x: UpstreamBehaviour = (req, res) => json(200, xFixtureText(req.url!.startsWith('/2/tweets') ? 'tweet' : 'user'))(req, res);
  const [own, quiet, xDefault, xOpen] = await Promise.all([startUpstream(t, sampleProvider), startUpstream(t, sampleProvider), startUpstream(t, x), startUpstream(t, x)]);
  const upstreams = [
    v1('own', own.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }`),
    v1('quiet', quiet.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }, propagate_trace: false`),
    `xdefault: { kind: x_v2, url: "${xDefault.url}", bearer_token: "${X_TOKEN}" }`,
    `xopen: { kind: x_v2, url: "${xOpen.url}", bearer_token: "${X_TOKEN}", propagate_trace: true }`,
  ].join('\n');
  const routes = 'routes: { user: [own], tweets: [quiet], replies: [quiet], following: [quiet], tweet: [xdefault], user_by_username: [xopen] }';
  const yaml = testConfig(upstreams, `${routes}\n${tracing(receiver)}`);
  const perch = await traced(t, yaml);
  for (const path of ['/v1/users/2244994945', '/v1/users/2244994945/tweets', '/v1/tweets/1460323737035677698', '/v1/users/by/username/XDevelopers']) {
    assert.equal((await perch.request(path)).status, 200, path);
  }
  const lines = accessLines(perch);
  const traceparent = (u: typeof own) => u.requests[0]!.headers.traceparent;
  assert.match(String(traceparent(own)), new RegExp(`^00-${lines[0]!.trace_id}-`));
  assert.equal(traceparent(quiet), undefined);
  assert.equal(traceparent(xDefault), undefined);
  assert.match(String(traceparent(xOpen)), new RegExp(`^00-${lines[3]!.trace_id}-`));
  // Traced all the same: propagation is about the provider, not about perch's own spans.
  for (const [i, name] of [[1, 'quiet'], [2, 'xdefault']] as const) {
    const spans = await spansOf(receiver, lines[i]!.trace_id, 3);
    assert.equal(spans.find((s) => s.kind === CLIENT)!.attributes['perch.upstream'], name);
  }
  assertNoSecrets(receiver, yaml);
});

test('a memory miss with Redis: the Redis lookup has its span', { timeout: 30_000 }, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = testConfig(v1('main', upstream.url, `headers: { X-API-Key: "${PROVIDER_SECRET}" }`), `cache: { redis: { url: "${redis.url}" } }\n${tracing(receiver)}`);
  const perch = await traced(t, yaml);
  assert.equal((await perch.request('/v1/users/4')).status, 200);
  const [line] = accessLines(perch);
  const spans = await spansOf(receiver, line!.trace_id, 4);
  const server = spans.find((s) => s.kind === SERVER)!;
  const lookup = childrenOf(spans, server).find((s) => s.name === 'cache redis lookup')!;
  assert.deepEqual([lookup.kind, lookup.attributes['db.system.name'], lookup.attributes['perch.cache.found']], [CLIENT, 'redis', 'none']);
  assertNoSecrets(receiver, yaml);
});
