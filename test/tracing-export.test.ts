import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { ExportResultCode, type ExportResult } from '@opentelemetry/core';
import type { ReadableSpan, SpanExporter } from '@opentelemetry/sdk-trace';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { EXPORT_SUMMARY_INTERVAL_MS, SummarizedExporter } from '../src/tracing/export-failures.js';
import { tracingSettings } from '../src/tracing/settings.js';
import { ManualClock } from './helpers/clock.js';
import { onCleanup } from './helpers/cleanup.js';
import { captureLogs } from './helpers/log-capture.js';
import { startOtlpReceiver } from './helpers/otlp-receiver.js';
import { KEY, pollFor, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { spawnPerch } from './helpers/perch-process.js';
import { tempDir } from './helpers/temp-dir.js';
import { refusedPort, sampleProvider, startUpstream } from './helpers/upstream-server.js';

const T = { timeout: 30_000 };

function problemsOf(text: string): readonly string[] {
  try {
    parseConfig(text, {});
  } catch (error) {
    assert.ok(error instanceof ConfigError, String(error));
    return error.problems;
  }
  assert.fail('expected the configuration to be rejected');
}

test('the tracing section: defaults, and what an endpoint may be', T, () => {
  const base = testConfig('main: { kind: fixture }');
  assert.equal(parseConfig(base, {}).tracing, undefined);
  assert.deepEqual(parseConfig(`${base}\ntracing: { endpoint: "http://collector:4318" }`, {}).tracing, {
    endpoint: 'http://collector:4318',
    sample_ratio: 1,
    service_name: 'perch',
    client_tracestate: false,
  });
  assert.deepEqual(problemsOf(`${base}\ntracing: { endpoint: "ftp://collector" }`), ['tracing.endpoint: must use http: or https:']);
  assert.deepEqual(problemsOf(`${base}\ntracing: { endpoint: "http://u:p@collector" }`), ['tracing.endpoint: must not contain a username or password (put credentials in headers)']);
  assert.deepEqual(problemsOf(`${base}\ntracing: { endpoint: "collector" }`), ['tracing.endpoint: must be an absolute http: or https: URL']);
  assert.equal(problemsOf(`${base}\ntracing: { endpoint: "http://c", sample_ratio: 2 }`).length, 1);
  assert.deepEqual(problemsOf(`${base}\ntracing: { endpoint: "http://c", headers: { "Bad Name": "x" } }`), ['tracing.headers["Bad Name"]: is not a valid header name']);
});

test('settings: the section, else the standard OTEL_* variables, else off', T, () => {
  const section = { endpoint: 'http://collector:4318/', headers: { a: 'b' }, sample_ratio: 0.5, service_name: 'edge', client_tracestate: true };
  assert.deepEqual(tracingSettings(section, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://other' }), {
    url: 'http://collector:4318/v1/traces',
    headers: { a: 'b' },
    sampleRatio: 0.5,
    serviceName: 'edge',
    clientTracestate: true,
  });
  assert.equal(tracingSettings(undefined, {}), undefined);
  assert.deepEqual(
    tracingSettings(undefined, {
      OTEL_EXPORTER_OTLP_ENDPOINT: 'https://collector/otlp',
      OTEL_EXPORTER_OTLP_HEADERS: 'authorization=Bearer%20t1,x-tenant=a',
      OTEL_EXPORTER_OTLP_TRACES_HEADERS: 'x-tenant=b',
      OTEL_SERVICE_NAME: 'perch-eu',
      OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
      OTEL_TRACES_SAMPLER_ARG: '0.25',
    }),
    { url: 'https://collector/otlp/v1/traces', headers: { authorization: 'Bearer t1', 'x-tenant': 'b' }, sampleRatio: 0.25, serviceName: 'perch-eu', clientTracestate: false },
  );
  // The signal's own variable is the full URL, as the specification has it.
  assert.equal(tracingSettings(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://a', OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://b/traces' })?.url, 'http://b/traces');
  assert.equal(tracingSettings(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://a', OTEL_TRACES_SAMPLER: 'always_off' })?.sampleRatio, 0);
  assert.equal(tracingSettings(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://a', OTEL_SDK_DISABLED: 'true' }), undefined);
});

test('with no tracing section, the OTEL_* variables turn tracing on', T, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const upstream = await startUpstream(t, sampleProvider);
  const env = { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_SERVICE_NAME: 'perch-env', OTEL_EXPORTER_OTLP_HEADERS: 'x-tenant=blue' };
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)), { env, traceExportDelayMs: 10 });
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const line = perch.logs.lines().find((l) => l.msg === 'request')!;
  const span = await pollFor(() => receiver.spans.find((s) => s.spanId === line.span_id));
  assert.equal(span.resource['service.name'], 'perch-env');
  assert.equal(receiver.exports[0]!['x-tenant'], 'blue');
});

/** A stand-in collector that accepts connections and never answers. */
async function silentCollector(t: TestContext): Promise<string> {
  const server = createServer(() => undefined);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  onCleanup(t, () => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

for (const kind of ['unreachable', 'silent'] as const) {
  test(`${kind === 'unreachable' ? 'an unreachable' : 'a silent'} collector neither fails nor holds a request, and costs at most one log line`, T, async (t) => {
    const endpoint = kind === 'unreachable' ? `http://127.0.0.1:${await refusedPort()}` : await silentCollector(t);
    const upstream = await startUpstream(t, sampleProvider);
    // A short grace: stopping does not wait out the exporter's own retries.
    const yaml = testConfig(v1('main', upstream.url), `tracing: { endpoint: "${endpoint}" }`).replace('port: 0 }', 'port: 0, shutdown_grace_ms: 300 }');
    // Each request's span goes out in an export of its own.
    const perch = await startPerch(t, yaml, { traceExportDelayMs: 5, traceExportBatchSize: 1 });
    for (let i = 0; i < 10; i++) {
      const started = performance.now();
      assert.equal((await perch.request(`/v1/users/${i % 4}`)).status, 200);
      assert.ok(performance.now() - started < 1000, 'answered at once');
    }
    const failures = () => perch.logs.lines().filter((l) => String(l.msg).startsWith('trace export'));
    // The exporter retries a refused connection for some seconds before it reports the failure.
    if (kind === 'unreachable') await waitFor(() => failures().length === 1, 20_000);
    assert.ok(failures().length <= 1, JSON.stringify(failures()));
  });
}

/** A stand-in for the OTLP exporter: fails every export with a connection error. */
class FailingExporter implements SpanExporter {
  export(_spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    done({ code: ExportResultCode.FAILED, error: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:4318 with a body'), { code: 'ECONNREFUSED' }) });
  }
  shutdown(): Promise<void> {
    return Promise.resolve();
  }
}

test('export failures: the first logged at once, the rest summarized once per interval, and on shutdown', T, async () => {
  const clock = new ManualClock();
  const logs = captureLogs();
  const exporter = new SummarizedExporter(new FailingExporter(), { clock, logger: logs.logger });
  const exportOnce = () => exporter.export([{} as ReadableSpan, {} as ReadableSpan], () => undefined);
  for (let i = 0; i < 5; i++) exportOnce();
  const lines = () => logs.lines().filter((l) => l.dependency === 'otlp');
  await waitFor(() => lines().length === 1);
  assert.deepEqual([lines()[0]!.msg, lines()[0]!.reason, lines()[0]!.spans], ['trace export failed; spans dropped (further failures are summarized)', 'ECONNREFUSED', 2]);
  clock.advance(EXPORT_SUMMARY_INTERVAL_MS - 1);
  exportOnce();
  assert.equal(lines().length, 1);
  clock.advance(1);
  exportOnce();
  await waitFor(() => lines().length === 2);
  assert.deepEqual([lines()[1]!.failed_exports, lines()[1]!.spans, lines()[1]!.interval_ms], [5, 10, EXPORT_SUMMARY_INTERVAL_MS]);
  exportOnce();
  await exporter.shutdown();
  await waitFor(() => lines().length === 3);
  assert.deepEqual([lines()[2]!.failed_exports, lines()[2]!.spans], [2, 4]);
  assert.ok(!logs.text().includes('with a body'), 'the error message is not logged');
});

test('SIGTERM exports the buffered spans before perch exits, within shutdown_grace_ms', T, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const upstream = await startUpstream(t, sampleProvider);
  const dir = tempDir(t, 'perch-trace-');
  const path = join(dir, 'perch.yaml');
  writeFileSync(path, testConfig(v1('main', upstream.url), `tracing: { endpoint: "${receiver.url}" }`));
  const perch = await spawnPerch(t, path);
  assert.equal((await fetch(`${perch.url}/v1/users/1`, { headers: { 'x-api-key': KEY } })).status, 200);
  const line = await pollFor(() => perch.stdout().split('\n').map((l) => (l.includes('"msg":"request"') ? (JSON.parse(l) as { span_id: string }) : undefined)).find((l) => l !== undefined));
  // The batch would wait 5 s: the span leaves now only because perch is stopping.
  assert.equal(receiver.spans.length, 0);
  const stopped = performance.now();
  perch.process.kill('SIGTERM');
  assert.equal((await perch.exited).code, 0);
  assert.ok(performance.now() - stopped < 4000);
  assert.ok(receiver.spans.some((s) => s.spanId === line.span_id));
});

test('SIGTERM with a collector that never answers: perch still exits within shutdown_grace_ms', T, async (t) => {
  const endpoint = await silentCollector(t);
  const upstream = await startUpstream(t, sampleProvider);
  const dir = tempDir(t, 'perch-trace-');
  const path = join(dir, 'perch.yaml');
  writeFileSync(path, testConfig(v1('main', upstream.url), `tracing: { endpoint: "${endpoint}" }`).replace('port: 0 }', 'port: 0, shutdown_grace_ms: 500 }'));
  const perch = await spawnPerch(t, path);
  assert.equal((await fetch(`${perch.url}/v1/users/1`, { headers: { 'x-api-key': KEY } })).status, 200);
  const stopped = performance.now();
  perch.process.kill('SIGTERM');
  assert.equal((await perch.exited).code, 0);
  assert.ok(performance.now() - stopped < 3000, `exited after ${Math.round(performance.now() - stopped)} ms`);
});
