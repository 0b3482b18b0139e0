import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { parseConfig } from '../src/config/load.js';
import { createPerch } from '../src/app/perch.js';
import { captureLogs } from './helpers/log-capture.js';
import { KEY, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { assertClosingError, holdConnection, onlyResponse, parseResponses, rawExchange, rawGet, type HeldSocket } from './helpers/raw-http.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

// Sizes stay in the hundreds: other work shares the machine's cores, and each defect shows at
// this scale as clearly as at ten thousand.
const T = { timeout: 30_000 };

async function fixturePerch(t: TestContext, server: string) {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }').replace('port: 0 }', `port: 0, ${server} }`));
  return { perch, port: Number(new URL(perch.url).port) };
}

async function holdMany(t: TestContext, port: number, count: number): Promise<HeldSocket[]> {
  const held: HeldSocket[] = [];
  // One at a time, so their order of arrival is the order of the array.
  for (let i = 0; i < count; i++) held.push(await holdConnection(t, port));
  return held;
}

const isClosed = async (socket: HeldSocket) =>
  Promise.race([socket.closed.then(() => true), new Promise<boolean>((resolve) => setImmediate(() => resolve(false)))]);

/** A request on a fresh connection that the server closes after answering. */
const oneShot = (port: number, path = '/v1/users/1') => rawExchange(port, rawGet(path, KEY, ['Connection: close']), { timeoutMs: 10_000 });

test('an incomplete head is answered 408 E408 within headers_timeout_ms plus a second, not ~30 s', T, async (t) => {
  const { port } = await fixturePerch(t, 'headers_timeout_ms: 1000, request_timeout_ms: 1000');
  const result = await rawExchange(port, `GET /v1/users/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${KEY}\r\n`, { timeoutMs: 8000 });
  assert.equal(result.ending, 'closed', 'the server closed the connection');
  assertClosingError(onlyResponse(result.text), 408, 'E408');
  assert.ok(result.ms >= 900 && result.ms < 2000, `closed after ${Math.round(result.ms)} ms`);
});

test('a connection that sends nothing is closed silently within headers_timeout_ms plus a second', T, async (t) => {
  const { port } = await fixturePerch(t, 'headers_timeout_ms: 1000, request_timeout_ms: 1000');
  const result = await rawExchange(port, '', { timeoutMs: 8000 });
  assert.equal(result.ending, 'closed');
  assert.equal(result.text, '', 'no 408 to a client that asked nothing');
  assert.ok(result.ms >= 900 && result.ms < 2000, `closed after ${Math.round(result.ms)} ms`);
});

test('at max_connections, connections that sent nothing are shed oldest first to admit new clients', T, async (t) => {
  const { port } = await fixturePerch(t, 'max_connections: 20');
  const idle = await holdMany(t, port, 60);
  const answers = await Promise.all(Array.from({ length: 30 }, () => oneShot(port)));
  for (const answer of answers) assert.equal(onlyResponse(answer.text).status, 200, answer.text);
  // The 20 newest idle connections may survive; every one older than them was shed, in order.
  await Promise.all(idle.slice(0, 40).map((socket) => socket.closed));
  const open = await Promise.all(idle.map(isClosed));
  const firstOpen = open.indexOf(false);
  assert.ok(firstOpen === -1 || open.slice(firstOpen).every((closed) => !closed), `shed out of order: ${open.join(',')}`);
});

test('at max_connections, idle keep-alive connections are shed after the ones that sent nothing', T, async (t) => {
  const { port } = await fixturePerch(t, 'max_connections: 4, keep_alive_timeout_ms: 60000');
  const served = async () => {
    const [socket] = await holdMany(t, port, 1);
    socket!.socket.write(rawGet('/v1/users/1', KEY));
    await waitFor(() => parseResponses(socket!.received()).length === 1);
    assert.equal(parseResponses(socket!.received())[0]!.status, 200);
    return socket!;
  };
  const kept = [await served(), await served()];
  const silent = await holdMany(t, port, 2);
  // Four open, the cap: each new client sheds a silent connection first, oldest first...
  await served();
  await silent[0]!.closed;
  assert.equal(await isClosed(silent[1]!), false);
  await served();
  await silent[1]!.closed;
  // ...then the longest-idle keep-alive one.
  await served();
  await kept[0]!.closed;
  assert.equal(await isClosed(kept[1]!), false, 'the newer keep-alive connection is still open');
});

test('at max_connections, a connection being answered is never shed, and one idle again is the newest idle', T, async (t) => {
  // The upstream holds /v1/users/2 until told to answer: a request for it keeps its connection busy.
  const held: (() => void)[] = [];
  const upstream = await startUpstream(t, (req, res) => {
    if (req.url === '/v1/users/2') held.push(() => sampleProvider(req, res));
    else sampleProvider(req, res);
  });
  const yaml = testConfig(v1('demo', upstream.url, 'timeout_ms: 20000')).replace('port: 0 }', 'port: 0, max_connections: 3, keep_alive_timeout_ms: 60000 }');
  const port = Number(new URL((await startPerch(t, yaml)).url).port);
  const ask = async (socket: HeldSocket, path: string, answers: number) => {
    socket.socket.write(rawGet(path, KEY));
    await waitFor(() => parseResponses(socket.received()).length === answers);
  };
  const [a, b, c] = await holdMany(t, port, 3);
  for (const socket of [a!, b!, c!]) await ask(socket, '/v1/users/1', 1);
  // Idle since: a, b, c. Then a is being answered, and b is used and idle again.
  await ask(a!, '/v1/users/2', 1);
  await waitFor(() => held.length === 1);
  await ask(b!, '/v1/users/1', 2);
  // At the cap a new client sheds the longest idle: c, not the busy a nor the newer idle b.
  await holdMany(t, port, 1);
  await Promise.race([a!, b!, c!].map((socket) => socket.closed));
  assert.deepEqual(await Promise.all([a!, b!, c!].map(isClosed)), [false, false, true]);
  held.shift()!();
  await waitFor(() => parseResponses(a!.received()).length === 2);
  assert.equal(parseResponses(a!.received())[1]!.status, 200);
});

test('slow heads at the connection cap neither lock clients out nor slow them much', T, async (t) => {
  const { port } = await fixturePerch(t, 'max_connections: 60, headers_timeout_ms: 3000, request_timeout_ms: 3000');
  const slow = await holdMany(t, port, 100);
  // Slowloris: each connection sends one more header byte every 100 ms and never finishes.
  for (const socket of slow) socket.socket.write(`GET /v1/users/1 HTTP/1.1\r\nHost: x\r\n`);
  const drip = setInterval(() => {
    for (const socket of slow) if (!socket.socket.destroyed) socket.socket.write('X');
  }, 100);
  onCleanup(t, () => clearInterval(drip));
  const latencies: number[] = [];
  for (let i = 0; i < 40; i++) {
    const answer = await oneShot(port);
    assert.equal(onlyResponse(answer.text).status, 200, answer.text);
    latencies.push(answer.ms);
  }
  latencies.sort((a, b) => a - b);
  const p95 = latencies[Math.floor(latencies.length * 0.95)]!;
  assert.ok(p95 < 500, `p95 ${Math.round(p95)} ms with slow heads open`);
  // Every slow head is gone within its bound, shed or timed out.
  await Promise.all(slow.map((socket) => socket.closed));
});

test('a request followed by a half-close is answered, then the connection closed', T, async (t) => {
  // The answer comes after the FIN has arrived: the upstream takes a moment (`printf ... | nc -N`).
  const upstream = await startUpstream(t, (req, res) => void setTimeout(() => sampleProvider(req, res), 50));
  const perch = await startPerch(t, testConfig(v1('slow', upstream.url)));
  const port = Number(new URL(perch.url).port);
  const answers = await Promise.all(Array.from({ length: 50 }, (_, i) => rawExchange(port, rawGet(`/v1/users/${i + 1}`, KEY), { halfClose: true })));
  for (const answer of answers) {
    assert.equal(answer.ending, 'closed');
    const response = onlyResponse(answer.text);
    assert.equal(response.status, 200);
    assert.equal(JSON.parse(response.body).id, '123');
  }
  assert.equal(upstream.requests.length, 50);
  assert.deepEqual(upstream.requests.map((r) => r.url).sort(), answers.map((_, i) => `/v1/users/${i + 1}`).sort());
});

test('while draining, in-flight answers say Connection: close and no further request is served', T, async (t) => {
  const upstream = await startUpstream(t, (req, res) => void setTimeout(() => sampleProvider(req, res), 300));
  const config = parseConfig(testConfig(v1('slow', upstream.url)).replace('port: 0 }', 'port: 0, shutdown_grace_ms: 5000 }'), {});
  const perch = createPerch({ config, logger: captureLogs().logger });
  const { port } = await perch.listen();
  let closing: Promise<void> | undefined;
  onCleanup(t, () => closing ?? perch.close());

  const silent = await holdMany(t, port, 3);
  const busy = await holdMany(t, port, 5);
  for (const [i, socket] of busy.entries()) socket.socket.write(rawGet(`/v1/users/${i + 1}`, KEY));
  await waitFor(() => upstream.requests.length === 5);
  const started = performance.now();
  closing = perch.close();
  // Connections that never sent a request are closed at once, not left to their head timeout.
  await Promise.all(silent.map((socket) => socket.closed));
  await Promise.all(busy.map((socket) => waitFor(() => parseResponses(socket.received()).length === 1)));
  for (const socket of busy) {
    const [response] = parseResponses(socket.received());
    assert.equal(response!.status, 200);
    assert.equal(response!.headers.connection, 'close');
    // A client that reuses the connection anyway gets no answer: it was told to close.
    socket.socket.write(rawGet('/v1/users/99', KEY));
  }
  await Promise.all(busy.map((socket) => socket.closed));
  await closing;
  assert.ok(performance.now() - started < 4000, 'drained without waiting out the grace period');
  for (const socket of busy) assert.equal(parseResponses(socket.received()).length, 1);
  assert.equal(upstream.requests.length, 5, 'the reused connection reached nothing');
});
