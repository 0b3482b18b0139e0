import assert from 'node:assert/strict';
import { createServer, request, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test, type TestContext } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { onCleanup } from './helpers/cleanup.js';
import { captureLogs } from './helpers/log-capture.js';
import { startOtlpReceiver } from './helpers/otlp-receiver.js';
import { IdPool } from '../src/tracing/id-pool.js';
import { createTracing, endRequestSpan } from '../src/tracing/tracing.js';
import type { TraceSpan } from '../src/tracing/trace-span.js';

/** Real requests on a node:http server on port 0: each is handed to `onRequest` and answered 204. */
async function requestSource(t: TestContext, onRequest: (req: IncomingMessage) => void): Promise<(headers?: Record<string, string>) => Promise<void>> {
  const server = createServer((req, res) => {
    onRequest(req);
    res.writeHead(204).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  onCleanup(t, () => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const { port } = server.address() as AddressInfo;
  return (headers = {}) =>
    new Promise<void>((resolve, reject) => {
      request({ host: '127.0.0.1', port, path: '/v1/users/12?x=1', headers }, (res) => res.resume().on('end', resolve)).on('error', reject).end();
    });
}

/** Tracing at `sampleRatio` whose draws for new traces come from `draws`, in order. */
async function tracedSource(t: TestContext, sampleRatio: number, draws: number[]) {
  const receiver = await startOtlpReceiver(t);
  const tracing = createTracing(
    { url: `${receiver.url}/v1/traces`, headers: {}, sampleRatio, serviceName: 'perch-test', clientTracestate: false },
    { clock: new ManualClock(), logger: captureLogs().logger, exportDelayMs: 10, random: () => draws.shift() ?? assert.fail('no draw left') },
  );
  onCleanup(t, () => tracing.close());
  const spans: TraceSpan[] = [];
  // Whether each span was recording while its request ran (an ended span records no more).
  const recording: boolean[] = [];
  const send = await requestSource(t, (req) => {
    const span = tracing.request(req, `req-${spans.length}`, true);
    spans.push(span);
    recording.push(span.recording);
    endRequestSpan(span, req.method, { route: 'user', status: 200, cache: 'hit', keyId: 'alpha', upstream: undefined });
  });
  return { receiver, spans, recording, send, draws, tracing };
}

test('a new trace is kept when its draw is below sample_ratio, with the request attributes; otherwise it has ids only', { timeout: 10_000 }, async (t) => {
  const { receiver, spans, recording, send, draws, tracing } = await tracedSource(t, 0.25, [0.2499, 0.25, 0.9]);
  for (let i = 0; i < 3; i++) await send();
  assert.deepEqual(draws, []);
  assert.deepEqual(recording, [true, false, false]);
  for (const span of spans) {
    assert.match(span.traceId, /^[0-9a-f]{32}$/);
    assert.match(span.spanId, /^[0-9a-f]{16}$/);
  }
  assert.equal(new Set(spans.map((s) => s.traceId)).size, 3);
  assert.deepEqual(
    spans.map((s) => s.headers().traceparent),
    spans.map((s, i) => `00-${s.traceId}-${s.spanId}-${i === 0 ? '01' : '00'}`),
  );
  // Closing exports all that was kept: only the first trace was.
  await tracing.close();
  assert.deepEqual(
    receiver.spans.map((s) => s.traceId),
    [spans[0]!.traceId],
  );
  const [kept] = receiver.spans;
  assert.equal(kept!.name, 'GET /v1/users/{user_id}');
  assert.equal(kept!.attributes['url.path'], '/v1/users/12');
  assert.equal(kept!.attributes['perch.request_id'], 'req-0');
  assert.equal(kept!.attributes['perch.cache'], 'hit');
});

test('a caller\'s valid traceparent decides without a draw; an invalid one starts a new trace that the draw decides', { timeout: 10_000 }, async (t) => {
  const { receiver, spans, recording, send, draws, tracing } = await tracedSource(t, 0.5, [0.7]);
  const callerTrace = '4bf92f3577b34da6a3ce929d0e0e4736';
  await send({ traceparent: `00-${callerTrace}-00f067aa0ba902b7-01` });
  await send({ traceparent: `00-${callerTrace}-00f067aa0ba902b7-00` });
  await send({ traceparent: '00-not-a-trace-01' });
  assert.deepEqual(draws, []);
  assert.deepEqual(
    spans.map((s, i) => [s.traceId === callerTrace, recording[i]]),
    [
      [true, true],
      [true, false],
      [false, false],
    ],
  );
  await tracing.close();
  assert.deepEqual(
    receiver.spans.map((s) => s.traceId),
    [callerTrace],
  );
});

test('the id pool gives valid, distinct ids across refills of its random bytes', { timeout: 10_000 }, () => {
  const pool = new IdPool();
  const traceIds = new Set<string>();
  const spanIds = new Set<string>();
  // 4 KiB of random bytes make 256 trace ids: 2,000 of each kind crosses many refills, mixed.
  for (let i = 0; i < 2_000; i++) {
    const traceId = pool.generateTraceId();
    const spanId = pool.generateSpanId();
    assert.match(traceId, /^[0-9a-f]{32}$/);
    assert.match(spanId, /^[0-9a-f]{16}$/);
    traceIds.add(traceId);
    spanIds.add(spanId);
  }
  assert.equal(traceIds.size, 2_000);
  assert.equal(spanIds.size, 2_000);
});
