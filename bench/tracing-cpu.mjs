#!/usr/bin/env node
// `npm run tracing-cpu` from bench/: tracing's own CPU per request, in this process, without
// HTTP: the work the hit path adds when tracing is on (the server span, its ids for the access
// line, its end), for sample_ratio 0, 0.01 and 1. The wrk figures of the tracing scenario are
// the targets; this isolates the part of them that is tracing's code, where the machine's noise
// hides a few microseconds in 50. Spans go to an OTLP/HTTP sink in this process. At ratio 1 the
// batch queue (2048 spans) overflows at this rate and drops spans, so that row leaves out most
// of the export; the wrk figure has it. BENCH_TRACING_CPU_REQUESTS (200000), _ROUNDS (5).
import { createServer } from 'node:http';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { perchRoot } from './lib/standalone.mjs';

const repoRoot = perchRoot();
const { createTracing, endRequestSpan } = await import(pathToFileURL(join(repoRoot, 'dist/src/tracing/tracing.js')).href);
const requests = Number(process.env.BENCH_TRACING_CPU_REQUESTS ?? 200_000);
const rounds = Number(process.env.BENCH_TRACING_CPU_ROUNDS ?? 5);

const sink = createServer((req, res) => req.resume().on('end', () => res.writeHead(200).end()));
await new Promise((resolve) => sink.listen(0, '127.0.0.1', resolve));
const quiet = { warn() {}, info() {}, error() {}, debug() {}, child() { return quiet; } };
// The fields the hit path reads from a request; a real IncomingMessage has them the same way.
const req = { method: 'GET', url: '/v1/users/1/tweets', headers: { 'user-agent': 'wrk', 'x-api-key': 'k' }, httpVersion: '1.1', socket: { remoteAddress: '127.0.0.1' } };
const facts = { route: 'tweets', status: 200, cache: 'hit', keyId: 'bench', upstream: undefined };

let idChars = 0;
for (const ratio of [0, 0.01, 1]) {
  const tracing = createTracing({ url: `http://127.0.0.1:${sink.address().port}/v1/traces`, headers: {}, sampleRatio: ratio, serviceName: 'bench' }, { clock: { now: Date.now }, logger: quiet });
  const perRequest = [];
  for (let round = 0; round <= rounds; round++) {
    const before = process.cpuUsage();
    for (let i = 0; i < requests; i++) {
      const span = tracing.request(req, `r${i}`);
      idChars += span.traceId.length + span.spanId.length; // as the access line reads them
      endRequestSpan(span, 'GET', facts);
      // Let the exporter's timers and sockets run, as they would between requests.
      if (i % 5000 === 4999) await new Promise((resolve) => setImmediate(resolve));
    }
    const used = process.cpuUsage(before);
    if (round > 0) perRequest.push((used.user + used.system) / requests); // round 0 warms up
  }
  await tracing.close();
  perRequest.sort((a, b) => a - b);
  console.log(`sample_ratio ${ratio}: ${perRequest[Math.floor(perRequest.length / 2)].toFixed(2)} µs CPU per request (median of ${rounds} rounds of ${requests}; rounds ${perRequest.map((v) => v.toFixed(2)).join(' / ')})`);
}
sink.closeAllConnections();
sink.close();
if (idChars === 0) throw new Error('no ids read');
