import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { KEY, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { spawnPerch } from './helpers/perch-process.js';
import { tempDir } from './helpers/temp-dir.js';
import { assertClosingError, onlyResponse, parseResponses, rawExchange, rawGet } from './helpers/raw-http.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

const T = { timeout: 20_000 };

async function fixturePerch(t: Parameters<typeof startPerch>[0], server = '') {
  const yaml = testConfig('demo: { kind: fixture }');
  const perch = await startPerch(t, server === '' ? yaml : yaml.replace('port: 0 }', `port: 0, ${server} }`));
  return { perch, port: Number(new URL(perch.url).port) };
}

const MALFORMED: Record<string, string> = {
  'a space before the colon': `GET /v1/users/1 HTTP/1.1\r\nHost: x\r\nX-API-Key : ${KEY}\r\n\r\n`,
  'an invalid header-name character': `GET /v1/users/1 HTTP/1.1\r\nHost: x\r\nX-API(Key): ${KEY}\r\n\r\n`,
  'a control character in a header value': `GET /v1/users/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: a\u0001b\r\n\r\n`,
  'a bare LF inside the request line': `GET /v1/users/1\nHTTP/1.1\r\nHost: x\r\n\r\n`,
  'an unknown HTTP version': `GET /v1/users/1 HTTP/7.1\r\nHost: x\r\n\r\n`,
  'an invalid method token': `G(T /v1/users/1 HTTP/1.1\r\nHost: x\r\n\r\n`,
  'both Content-Length and chunked': `GET /v1/users/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
  'no Host header (HTTP/1.1)': `GET /v1/users/1 HTTP/1.1\r\nX-API-Key: ${KEY}\r\n\r\n`,
  'two different Content-Lengths': `GET /v1/users/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab`,
};

for (const [name, bytes] of Object.entries(MALFORMED)) {
  test(`a request with ${name} is answered 400 E400 in the error shape, then closed`, T, async (t) => {
    const { port } = await fixturePerch(t);
    const result = await rawExchange(port, bytes);
    assert.equal(result.ending, 'closed');
    assertClosingError(onlyResponse(result.text), 400, 'E400');
  });
}

test('a broken chunked body before any answer is 400 E400; after a sent answer the connection just closes', T, async (t) => {
  // A slow upstream keeps the first request unanswered while its broken body arrives.
  const upstream = await startUpstream(t, (req, res) => void setTimeout(() => sampleProvider(req, res), 300));
  const perch = await startPerch(t, testConfig(v1('slow', upstream.url)));
  const port = Number(new URL(perch.url).port);
  const chunked = (key: string) =>
    `GET /v1/users/7 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nnot a chunk\r\n\r\n`;
  const pending = await rawExchange(port, chunked(KEY));
  assert.equal(pending.ending, 'closed');
  assertClosingError(onlyResponse(pending.text), 400, 'E400');

  // Without a key the 401 is written at once; the broken body then must not add a second,
  // unsolicited response on the same connection.
  const answered = await rawExchange(port, chunked('wrong-key-0123456789'));
  assert.equal(answered.ending, 'closed');
  const responses = parseResponses(answered.text);
  assert.equal(responses.length, 1, answered.text);
  assert.equal(responses[0]!.status, 401);
});

test('a malformed request pipelined behind a miss is answered after it, never ahead of it', T, async (t) => {
  const held: (() => void)[] = [];
  const upstream = await startUpstream(t, (req, res) => held.push(() => sampleProvider(req, res)));
  const perch = await startPerch(t, testConfig(v1('slow', upstream.url)));
  const port = Number(new URL(perch.url).port);
  const exchange = rawExchange(port, rawGet('/v1/users/7', KEY) + MALFORMED['an invalid method token']!);
  await waitFor(() => upstream.requests.length === 1);
  held.shift()!();
  const result = await exchange;
  assert.equal(result.ending, 'closed');
  const responses = parseResponses(result.text);
  assert.deepEqual(
    responses.map((r) => r.status),
    [200, 400],
    result.text,
  );
  assert.equal(responses[0]!.headers['cache-status']?.includes('fwd=miss'), true, 'the first answer is the miss\'s');
  assertClosingError(responses[1]!, 400, 'E400');
});

test('a malformed request pipelined behind a miss that a shutdown answers last is never answered: the connection closes after the miss', T, async (t) => {
  const held: (() => void)[] = [];
  const upstream = await startUpstream(t, (req, res) => held.push(() => sampleProvider(req, res)));
  const path = join(tempDir(t, 'perch-client-errors-'), 'perch.yaml');
  writeFileSync(path, testConfig(v1('slow', upstream.url)).replace('port: 0 }', 'port: 0, shutdown_grace_ms: 60000 }'));
  const perch = await spawnPerch(t, path);
  const exchange = rawExchange(Number(new URL(perch.url).port), rawGet('/v1/users/7', KEY) + MALFORMED['an invalid method token']!);
  await waitFor(() => upstream.requests.length === 1);
  perch.process.kill('SIGTERM');
  await waitFor(() => perch.stdout().includes('perch stopping'));
  held.shift()!();
  const result = await exchange;
  assert.equal(result.ending, 'closed');
  const responses = parseResponses(result.text);
  assert.deepEqual(
    responses.map((r) => [r.status, r.headers.connection]),
    [[200, 'close']],
    result.text,
  );
});

for (const expect of ['101-continue', 'x-custom', '100-continu', 'gzip']) {
  test(`Expect: ${expect} is 417 E417 in the error shape`, T, async (t) => {
    const { port } = await fixturePerch(t);
    const result = await rawExchange(port, rawGet('/v1/users/1', KEY, [`Expect: ${expect}`]));
    assertClosingError(onlyResponse(result.text), 417, 'E417');
  });
}

test('Expect: 100-continue itself is honoured and the request served', T, async (t) => {
  const { port } = await fixturePerch(t);
  const result = await rawExchange(port, rawGet('/v1/users/1', KEY, ['Expect: 100-continue', 'Connection: close']));
  const final = result.text.slice(result.text.indexOf('HTTP/1.1 200'));
  assert.match(result.text, /^HTTP\/1\.1 100 Continue\r\n/);
  assert.equal(onlyResponse(final).status, 200);
});

test('an absolute-form target (RFC 9112 3.2.2) is served like its origin form', T, async (t) => {
  const { port } = await fixturePerch(t);
  for (const target of ['http://perch.test/v1/users/1', 'HTTP://other.example:8080/v1/users/1', 'http://perch.test/v1/users/1?x=1']) {
    const result = await rawExchange(port, rawGet(target, KEY, ['Connection: close']));
    const response = onlyResponse(result.text);
    assert.equal(response.status, 200, `${target}: ${result.text}`);
    assert.equal(JSON.parse(response.body).id, '1');
  }
  const health = await rawExchange(port, rawGet('http://perch.test/healthz', null, ['Connection: close']));
  assert.equal(onlyResponse(health.text).status, 200);
  // An absolute form with no path is the root, which is no route.
  const root = await rawExchange(port, rawGet('http://perch.test', KEY, ['Connection: close']));
  assert.equal(onlyResponse(root.text).status, 404);
});

test('CONNECT is answered 405 E405 with Allow, not a silent close', T, async (t) => {
  const { port } = await fixturePerch(t);
  for (const target of ['perch.test:443', '/v1/users/1']) {
    const result = await rawExchange(port, `CONNECT ${target} HTTP/1.1\r\nHost: perch.test\r\nX-API-Key: ${KEY}\r\n\r\n`);
    const response = onlyResponse(result.text);
    assertClosingError(response, 405, 'E405');
    assert.equal(response.headers.allow, 'GET, HEAD');
  }
});

test('max_header_bytes counts what arrives: many tiny headers over the bound are 431 E431', T, async (t) => {
  const { port } = await fixturePerch(t, 'max_header_bytes: 4096');
  // 1,200 headers of 1-byte names and values: Node counts 2,400 bytes, the wire carries ~7 KB.
  const tiny = Array.from({ length: 1200 }, (_, i) => `${String.fromCharCode(97 + (i % 26))}: b`);
  const result = await rawExchange(port, rawGet('/v1/users/1', KEY, tiny));
  assert.equal(result.ending, 'closed');
  assertClosingError(onlyResponse(result.text), 431, 'E431');
  // The same count of headers that fits is served.
  const fits = await rawExchange(port, rawGet('/v1/users/1', KEY, tiny.slice(0, 300).concat('Connection: close')));
  assert.equal(onlyResponse(fits.text).status, 200);
});

test('an oversized single header is still 431 E431 in the error shape', T, async (t) => {
  const { port } = await fixturePerch(t, 'max_header_bytes: 2048');
  const result = await rawExchange(port, rawGet('/v1/users/1', KEY, [`X-Big: ${'a'.repeat(4096)}`]));
  assertClosingError(onlyResponse(result.text), 431, 'E431');
});
