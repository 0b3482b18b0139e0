import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { request } from 'node:https';
import { connect } from 'node:net';
import { join } from 'node:path';
import { test } from 'node:test';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { createPerch } from '../src/app/perch.js';
import { captureLogs } from './helpers/log-capture.js';
import { KEY, startPerch, testConfig } from './helpers/perch.js';
import { tempDir } from './helpers/temp-dir.js';
import { onCleanup } from './helpers/cleanup.js';

/** The test configuration with more `server` keys. */
function withServer(keys: string): string {
  return testConfig('demo: { kind: fixture }').replace('server: { host: 127.0.0.1, port: 0 }', `server: { host: 127.0.0.1, port: 0, ${keys} }`);
}

/** Sends raw bytes and resolves with everything the server answers before closing. */
function raw(port: number, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(text));
    let answer = '';
    socket.on('data', (d) => (answer += d));
    socket.on('end', () => resolve(answer));
    socket.on('error', reject);
  });
}

test('a request head over server.max_header_bytes is answered 431 in the error shape', { timeout: 20_000 }, async (t) => {
  const perch = await startPerch(t, withServer('max_header_bytes: 2048'));
  const port = Number(new URL(perch.url).port);
  const answer = await raw(port, `GET /v1/users/1 HTTP/1.1\r\nhost: x\r\nx-api-key: ${KEY}\r\nx-big: ${'a'.repeat(4096)}\r\n\r\n`);
  assert.match(answer, /^HTTP\/1\.1 431 /);
  const body = answer.slice(answer.indexOf('\r\n\r\n') + 4);
  assert.deepEqual(JSON.parse(body), { error: { message: 'Request header fields too large', code: 'E431' } });
  // Within the limit the same request is served.
  assert.equal((await perch.request('/v1/users/1', { headers: { 'x-big': 'a'.repeat(512) } })).status, 200);
});

test('the server limits are validated with their key paths', () => {
  const bad = `${withServer('max_header_bytes: 10, headers_timeout_ms: 5000, request_timeout_ms: 1000, max_connections: 0, shutdown_grace_ms: -1, tls: { cert_file: 1 }')}
metrics: { port: 70000 }`;
  assert.throws(
    () => parseConfig(bad, {}),
    (error: ConfigError) => {
      for (const key of [
        'server.max_header_bytes',
        'server.request_timeout_ms',
        'server.max_connections',
        'server.shutdown_grace_ms',
        'server.tls.cert_file',
        'server.tls.key_file',
        'metrics.port',
      ]) {
        assert.ok(error.problems.some((p) => p.startsWith(`${key}:`)), `${key} in ${error.problems.join('\n')}`);
      }
      return true;
    },
  );
  const defaults = parseConfig(testConfig('demo: { kind: fixture }'), {}).server;
  assert.equal(defaults.shutdown_grace_ms, 10000);
  assert.equal(defaults.max_header_bytes, 16384);
  assert.equal(defaults.tls, undefined);
});

test('server.tls serves HTTPS with the given certificate', { timeout: 20_000 }, async (t) => {
  const dir = tempDir(t, 'perch-tls-');
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '1', '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'ignore' });
  const config = parseConfig(withServer(`tls: { cert_file: "${cert}", key_file: "${key}" }`), {});
  const perch = createPerch({ config, logger: captureLogs().logger });
  const { port } = await perch.listen();
  onCleanup(t, () => perch.close());
  const { status, body } = await new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/v1/users/by/username/perch_demo', headers: { 'x-api-key': KEY }, ca: readFileSync(cert) }, (res) => {
      let text = '';
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on('error', reject);
    req.end();
  });
  assert.equal(status, 200);
  assert.equal(JSON.parse(body).username, 'perch_demo');
  // Plain HTTP on the TLS port gets no API answer.
  await assert.rejects(fetch(`http://127.0.0.1:${port}/healthz`));
});

test('an unreadable TLS file fails start-up naming the key, not the content', () => {
  const config = parseConfig(withServer('tls: { cert_file: /nonexistent/cert.pem, key_file: /nonexistent/key.pem }'), {});
  assert.throws(() => createPerch({ config, logger: captureLogs().logger }), /server\.tls\.cert_file: cannot read \/nonexistent\/cert\.pem \(ENOENT\)/);
});
