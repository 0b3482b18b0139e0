import assert from 'node:assert/strict';
import { createServer, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test, type TestContext } from 'node:test';
import { onCleanup } from './helpers/cleanup.js';
import { undiciTransport } from '../src/tracing/undici-transport.js';

const T = { timeout: 10_000 };

interface Received {
  readonly path: string;
  readonly headers: IncomingHttpHeaders;
  readonly body: Buffer;
}

/** A collector on 127.0.0.1, port 0, that answers each POST as `answer` says. */
async function collector(t: TestContext, answer: (res: ServerResponse) => void) {
  const received: Received[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      received.push({ path: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks) });
      answer(res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  onCleanup(t, () => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, received };
}

function transportFor(t: TestContext, url: string, headers: Record<string, string> = {}) {
  const transport = undiciTransport(url, headers);
  onCleanup(t, () => transport.shutdown());
  return transport;
}

test('an export is one POST of the bytes, as protobuf, with the configured headers, to the full URL', T, async (t) => {
  const { url, received } = await collector(t, (res) => res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end(Buffer.from([1, 2])));
  const transport = transportFor(t, `${url}/v1/traces?tenant=a`, { authorization: 'Bearer token-1' });
  const result = await transport.send(new Uint8Array([10, 20, 30]), 5_000);
  assert.deepEqual(result, { status: 'success', data: Buffer.from([1, 2]) });
  assert.equal(received.length, 1);
  assert.equal(received[0]!.path, '/v1/traces?tenant=a');
  assert.equal(received[0]!.headers['content-type'], 'application/x-protobuf');
  assert.equal(received[0]!.headers.authorization, 'Bearer token-1');
  assert.deepEqual(received[0]!.body, Buffer.from([10, 20, 30]));
});

test('a collector that refuses: a failure whose code is the status, without the collector\'s body', T, async (t) => {
  const { url } = await collector(t, (res) => res.writeHead(503).end('overloaded: secret-detail'));
  const result = await transportFor(t, `${url}/v1/traces`).send(new Uint8Array([1]), 5_000);
  assert.equal(result.status, 'failure');
  const error = (result as { error: Error & { code?: unknown } }).error;
  assert.equal(error.code, 503);
  assert.ok(!String(error.message).includes('secret-detail'));
});

test('a collector that is not there: a failure with the connection error\'s code', T, async (t) => {
  const { url } = await collector(t, (res) => res.end());
  // A port that was just free: the collector above is on another one.
  const closed = await new Promise<number>((resolve) => {
    const probe = createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
  assert.notEqual(url, `http://127.0.0.1:${closed}`);
  const result = await transportFor(t, `http://127.0.0.1:${closed}/v1/traces`).send(new Uint8Array([1]), 5_000);
  assert.equal(result.status, 'failure');
  assert.equal((result as { error: { code?: unknown } }).error.code, 'ECONNREFUSED');
});

test('a collector that never answers: a failure once the export\'s timeout has passed', T, async (t) => {
  const held: ServerResponse[] = [];
  const { url } = await collector(t, (res) => held.push(res));
  const started = performance.now();
  const result = await transportFor(t, `${url}/v1/traces`).send(new Uint8Array([1]), 200);
  assert.equal(result.status, 'failure');
  assert.equal(held.length, 1);
  assert.ok(performance.now() - started >= 190, 'not before the timeout');
});
