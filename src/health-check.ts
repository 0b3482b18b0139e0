import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { ServerConfig } from './config/types.js';

/** Within the container HEALTHCHECK's own 3 s timeout, so a hung perch reads as unhealthy, not as a timeout. */
const TIMEOUT_MS = 2000;

/**
 * Whether perch answers `GET /healthz` with 200 on the listener `server` configures: the same
 * host, port and scheme as the configuration, so a health check never goes stale when the port
 * changes. A wildcard bind address is asked on loopback. With TLS the certificate is not
 * verified: it names the public host, and this asks whether the process serves, not who it is.
 */
export function healthCheck(server: ServerConfig): Promise<{ ok: boolean; detail: string }> {
  const host = server.host === '0.0.0.0' ? '127.0.0.1' : server.host === '::' ? '::1' : server.host;
  const request = server.tls === undefined ? httpRequest : httpsRequest;
  return new Promise((resolve) => {
    const req = request(
      { host, port: server.port, path: '/healthz', method: 'GET', timeout: TIMEOUT_MS, rejectUnauthorized: false },
      (res) => {
        res.resume();
        resolve({ ok: res.statusCode === 200, detail: `status ${res.statusCode ?? 'none'}` });
      },
    );
    req.on('timeout', () => req.destroy(new Error(`no answer within ${TIMEOUT_MS} ms`)));
    req.on('error', (error) => resolve({ ok: false, detail: error.message }));
    req.end();
  });
}
