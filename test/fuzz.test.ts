import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import fc from 'fast-check';
import { KEY, startPerch, testConfig, v1, type RunningPerch } from './helpers/perch.js';
import { parseResponses, rawExchange, type RawResponse } from './helpers/raw-http.js';
import { SAMPLE_BODIES } from './helpers/sample-bodies.js';
import { json, sampleProvider, startUpstream, type TestUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

/**
 * Property tests over what a client can send: methods, targets, header sets and raw bytes. Every
 * run holds perch to the same promises: it never crashes, never answers 5xx (the upstream here
 * always answers 200, so no 5xx is the upstream's), answers every error in the interface's shape,
 * closes every connection in bounded time, and sends the upstream nothing but a normalized request.
 * `PERCH_FUZZ_RUNS` sets the runs per property (default 200; a failure prints its seed).
 */
const RUNS = Number(process.env.PERCH_FUZZ_RUNS ?? 200);
const T = { timeout: Math.max(60_000, RUNS * 300) };

// What perch may send upstream: one of the six normalized paths, a cursor encodeURIComponent'd.
const CURSOR = "(?:[A-Za-z0-9\\-_.!~*'()]|%[0-9A-F]{2})+";
const NORMALIZED = new RegExp(
  `^/v1/(?:tweets/\\d{1,20}|users/(?:by/username/[a-z0-9_]{1,50}|\\d{1,20}(?:/(?:tweets|replies)(?:\\?cursor=(${CURSOR}))?|/following\\?count=(?:100|[1-9][0-9]?)(?:&cursor=(${CURSOR}))?)?))$`,
);
const CLIENT_HEADERS = ['x-api-key', 'cookie', 'authorization', 'x-fuzz', 'x-request-id', 'forwarded'];

interface Rig {
  readonly perch: RunningPerch;
  readonly upstream: TestUpstream;
  readonly port: number;
}

/**
 * The body of the endpoint a normalized path names (sampleProvider goes by the path's end, which
 * takes the user `/v1/users/by/username/tweets` for a tweets listing).
 */
const provider: UpstreamBehaviour = (req, res) => {
  const path = (req.url ?? '').split('?')[0]!;
  if (path.startsWith('/v1/users/by/username/')) json(200, SAMPLE_BODIES.user)(req, res);
  else sampleProvider(req, res);
};

async function rig(t: TestContext): Promise<Rig> {
  const upstream = await startUpstream(t, provider);
  const server = 'port: 0, headers_timeout_ms: 1000, request_timeout_ms: 1000 }';
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)).replace('port: 0 }', server));
  return { perch, upstream, port: Number(new URL(perch.url).port) };
}

/** The promises every answer keeps. */
function assertAnswer(response: RawResponse, context: string): void {
  assert.ok(response.status < 500, `${response.status} for ${context}`);
  if (response.status < 400) return;
  assert.match(response.headers['content-type'] ?? '', /^application\/json/, context);
  assert.equal(response.headers['cache-control'], 'no-store', context);
  if (response.body === '') return; // HEAD
  const body = JSON.parse(response.body) as { error: { message: unknown; code: unknown } };
  assert.deepEqual(Object.keys(body), ['error'], context);
  assert.equal(body.error.code, `E${response.status}`, context);
  assert.equal(typeof body.error.message, 'string', context);
}

/** Everything the upstream has seen is a normalized request carrying nothing of the client's. */
function assertUpstreamClean(upstream: TestUpstream, from = 0): void {
  for (const request of upstream.requests.slice(from)) {
    const match = NORMALIZED.exec(request.url);
    assert.ok(match !== null, `not normalized: ${request.url}`);
    const cursor = match[1] ?? match[2];
    if (cursor !== undefined) {
      const decoded = decodeURIComponent(cursor);
      assert.ok(Buffer.byteLength(decoded) <= 1024 && !/[\u0000-\u001f\u007f]/.test(decoded), `cursor ${cursor}`);
    }
    for (const name of CLIENT_HEADERS) assert.equal(request.headers[name], undefined, `${name} reached the upstream`);
  }
}

/**
 * One exchange on a fresh connection, checked: its answers, its close, and what it alone sent
 * upstream (a failing run must not fail the shrunk runs after it).
 */
async function exchange(rig: Rig, bytes: string | Buffer, head: boolean, context: string): Promise<RawResponse[]> {
  const sentBefore = rig.upstream.requests.length;
  // The FIN makes an incomplete head fail at once instead of waiting for its timeout.
  const result = await rawExchange(rig.port, bytes, { halfClose: true, timeoutMs: 5000 });
  assert.equal(result.ending, 'closed', `connection left open for ${context}`);
  const responses = parseResponses(result.text, head);
  for (const response of responses) assertAnswer(response, context);
  assertUpstreamClean(rig.upstream, sentBefore);
  return responses;
}

async function stillServing(rig: Rig): Promise<void> {
  assert.equal((await rig.perch.request('/healthz', { key: null })).status, 200);
  assert.equal((await rig.perch.request('/v1/users/1')).status, 200);
  assertUpstreamClean(rig.upstream);
}

const METHODS = fc.constantFrom('GET', 'GET', 'GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'OPTIONS', 'PATCH', 'TRACE', 'PURGE', 'get');

const SEGMENT = fc.oneof(
  fc.stringMatching(/^[0-9]{1,24}$/),
  fc.constantFrom('', '.', '..', '%2e%2e', '%2E', '%2F', '%00', '%', '%zz', 'by', 'username', 'tweets', 'replies', 'following', '1'),
  fc.stringMatching(/^[A-Za-z0-9_]{1,60}$/),
  fc.string({ unit: 'grapheme', maxLength: 12 }).map(encodeURIComponent),
  fc.stringMatching(/^(?:%[0-9A-Fa-f]{2}|[0-9a-z]){1,12}$/),
);

const QUERY_VALUE = fc.oneof(
  fc.stringMatching(/^[0-9]{0,4}$/),
  fc.string({ unit: 'grapheme', maxLength: 20 }).map(encodeURIComponent),
  fc.constantFrom('%', '%zz', '%00', '+', 'a+b', '%2B%2F%3D', '%0A', '%7F'),
  fc.integer({ min: 1000, max: 3000 }).map((n) => 'c'.repeat(n)),
  fc.integer({ min: 500, max: 520 }).map((n) => '%C3%A9'.repeat(n)),
);

const QUERY = fc
  .array(fc.tuple(fc.constantFrom('cursor', 'count', 'x', 'Cursor', 'count[]', '', 'cursor%00'), QUERY_VALUE), { maxLength: 6 })
  .map((pairs) => (pairs.length === 0 ? '' : `?${pairs.map(([k, v]) => `${k}=${v}`).join('&')}`));

const TARGET = fc
  .tuple(
    fc.constantFrom('/v1/users', '/v1/tweets', '/v1/users/by/username', '/v1', '', '//v1/users', '/v1//users', '/V1/users', 'http://perch.test/v1/users'),
    fc.array(SEGMENT, { minLength: 0, maxLength: 3 }),
    QUERY,
  )
  .map(([prefix, segments, query]) => `${prefix}/${segments.join('/')}${query}`);

const KEY_LINE = fc.constantFrom(`X-API-Key: ${KEY}\r\n`, `X-API-Key: ${KEY}\r\n`, '', 'X-API-Key: wrong-key-0123456789\r\n', `x-api-key: ${KEY}\r\nX-API-Key: ${KEY}\r\n`);

test('targets and methods: no crash, no 5xx, errors in shape, only normalized requests upstream', T, async (t) => {
  const r = await rig(t);
  await fc.assert(
    fc.asyncProperty(METHODS, TARGET, KEY_LINE, async (method, target, keyLine) => {
      const bytes = `${method} ${target} HTTP/1.1\r\nHost: perch.test\r\n${keyLine}Connection: close\r\n\r\n`;
      const responses = await exchange(r, bytes, method === 'HEAD', `${method} ${target}`);
      assert.equal(responses.length, 1, `one answer to ${method} ${target}`);
    }),
    { numRuns: RUNS },
  );
  await stillServing(r);
});

const HEADER_NAME = fc.oneof(
  fc.stringMatching(/^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}$/),
  fc.constantFrom('Cookie', 'Authorization', 'X-Fuzz', 'Forwarded', 'Content-Length', 'Transfer-Encoding', 'Expect', 'Host', 'Connection', 'X-API-Key ', 'X API Key', 'X-Api-Key\u0000'),
);
const HEADER_VALUE = fc.oneof(
  fc.string({ unit: 'binary-ascii', maxLength: 40 }),
  fc.string({ unit: 'grapheme', maxLength: 20 }),
  fc.constantFrom('chunked', '0', '-1', '100-continue', 'close', 'keep-alive', 'upgrade', `${KEY}`, ''),
  fc.integer({ min: 100, max: 9000 }).map((n) => 'v'.repeat(n)),
);

test('header sets: no crash, no 5xx, errors in shape, nothing of them upstream', T, async (t) => {
  const r = await rig(t);
  await fc.assert(
    fc.asyncProperty(fc.array(fc.tuple(HEADER_NAME, HEADER_VALUE), { maxLength: 8 }), KEY_LINE, async (headers, keyLine) => {
      const lines = headers.map(([name, value]) => `${name}: ${value}\r\n`).join('');
      const bytes = Buffer.from(`GET /v1/users/42 HTTP/1.1\r\nHost: perch.test\r\n${keyLine}${lines}Connection: close\r\n\r\n`, 'utf8');
      await exchange(r, bytes, false, JSON.stringify(headers));
    }),
    { numRuns: RUNS },
  );
  await stillServing(r);
});

const REQUEST_LINE = fc.constantFrom('GET /v1/users/1 HTTP/1.1\r\n', `GET /v1/users/1 HTTP/1.1\r\nX-API-Key: ${KEY}\r\n`, 'GET / HTTP/1.1\r\n', '', 'CONNECT a:1 HTTP/1.1\r\n');

test('raw bytes: no crash, no 5xx, every answer in shape, every connection closed', T, async (t) => {
  const r = await rig(t);
  await fc.assert(
    fc.asyncProperty(REQUEST_LINE, fc.uint8Array({ maxLength: 300 }), fc.boolean(), async (prefix, tail, finish) => {
      const bytes = Buffer.concat([Buffer.from(prefix), tail, Buffer.from(finish ? '\r\n\r\n' : '')]);
      await exchange(r, bytes, false, bytes.toString('latin1'));
    }),
    { numRuns: RUNS },
  );
  await stillServing(r);
});
