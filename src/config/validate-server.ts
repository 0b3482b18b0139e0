import { keysUnder } from './config-keys.js';
import type { RateLimitHeaderDialect, ServerConfig, TlsConfig } from './types.js';
import { Problems, checkKeys, field, indexPath, isMapping, readInteger, readString } from './schema-helpers.js';

const RATE_LIMIT_DIALECTS: readonly RateLimitHeaderDialect[] = ['ietf', 'x_rate_limit'];

const HOUR_MS = 3_600_000;

/** The listener: address, timeouts and size limits (safe defaults), and optional TLS. */
export function validateServer(problems: Problems, raw: Record<string, unknown>): ServerConfig {
  checkKeys(problems, raw, 'server', keysUnder('server'));
  const host = readString(problems, raw, 'host', 'server', '127.0.0.1');
  if (host === '') problems.add('server.host', 'must not be empty');
  const ms = (key: string, fallback: number, min = 1) =>
    readInteger(problems, raw, key, 'server', { min, max: HOUR_MS, fallback, expected: `an integer from ${min} to ${HOUR_MS}` });
  const headersTimeout = ms('headers_timeout_ms', 10_000);
  const requestTimeout = ms('request_timeout_ms', 30_000);
  // Node applies the request timeout to the headers too; a shorter one would silently win.
  if (requestTimeout < headersTimeout) problems.add('server.request_timeout_ms', 'must be at least server.headers_timeout_ms');
  const tls = validateTls(problems, field(raw, 'tls'));
  return {
    host: host ?? '127.0.0.1',
    port: readInteger(problems, raw, 'port', 'server', { min: 0, max: 65535, fallback: 8080, expected: 'an integer from 0 to 65535' }),
    shutdown_grace_ms: ms('shutdown_grace_ms', 10_000, 0),
    headers_timeout_ms: headersTimeout,
    request_timeout_ms: requestTimeout,
    miss_deadline_ms: ms('miss_deadline_ms', 10_000),
    keep_alive_timeout_ms: ms('keep_alive_timeout_ms', 5_000),
    max_header_bytes: readInteger(problems, raw, 'max_header_bytes', 'server', {
      min: 1024,
      max: 1_048_576,
      fallback: 16_384,
      expected: 'an integer from 1024 to 1048576',
    }),
    max_connections: readInteger(problems, raw, 'max_connections', 'server', {
      min: 1,
      max: 1_000_000,
      fallback: 10_000,
      expected: 'an integer from 1 to 1000000',
    }),
    ...(tls === undefined ? {} : { tls }),
    rate_limit_headers: validateDialects(problems, field(raw, 'rate_limit_headers')),
  };
}

function validateDialects(problems: Problems, raw: unknown): readonly RateLimitHeaderDialect[] {
  const path = 'server.rate_limit_headers';
  if (raw === undefined) return ['ietf'];
  if (!Array.isArray(raw) || raw.length === 0) {
    problems.add(path, `must be a non-empty list of ${RATE_LIMIT_DIALECTS.join(', ')}`);
    return ['ietf'];
  }
  const dialects: RateLimitHeaderDialect[] = [];
  raw.forEach((item: unknown, i) => {
    const known = RATE_LIMIT_DIALECTS.find((dialect) => dialect === item);
    if (known === undefined) problems.add(indexPath(path, i), `must be one of ${RATE_LIMIT_DIALECTS.join(', ')}`);
    else if (dialects.includes(known)) problems.add(indexPath(path, i), `repeats ${known}`);
    else dialects.push(known);
  });
  return dialects;
}

function validateTls(problems: Problems, raw: unknown): TlsConfig | undefined {
  if (raw === undefined) return undefined;
  if (!isMapping(raw)) {
    problems.add('server.tls', 'must be a mapping with cert_file and key_file');
    return undefined;
  }
  checkKeys(problems, raw, 'server.tls', keysUnder('server.tls'));
  const cert_file = readString(problems, raw, 'cert_file', 'server.tls') ?? '';
  const key_file = readString(problems, raw, 'key_file', 'server.tls') ?? '';
  return { cert_file, key_file };
}
