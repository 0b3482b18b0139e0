import { Pool, type Dispatcher } from 'undici';
import type { Clock } from '../clock.js';
import type { V1UpstreamConfig } from '../config/types.js';
import { ownedBytes } from '../cache/entry.js';
import { hasEndpointShape, type EndpointRequest } from '../endpoints.js';
import { retryAfterSeconds } from './retry-after.js';
import type { Upstream, UpstreamResult } from './upstream.js';

export interface V1UpstreamOptions {
  readonly clock: Clock;
  /**
   * Where requests go. Default: an undici Pool on `config.url` with `config.connections`
   * keep-alive connections. Tests and embedders inject their own to shape faults.
   */
  readonly dispatcher?: Dispatcher;
}

/**
 * An HTTP provider that speaks this same interface. perch builds each request from scratch
 * (normalized path, configured headers), so nothing of the client's request, its key least of
 * all, reaches the provider, and reduces each answer to an `UpstreamResult`, so nothing of the
 * provider's error bodies or headers reaches the client.
 */
export function createV1Upstream(name: string, config: V1UpstreamConfig, options: V1UpstreamOptions): Upstream {
  const dispatcher = options.dispatcher ?? new Pool(config.url, { connections: config.connections, pipelining: 1 });
  const origin = config.url;
  const headers: Record<string, string> = {
    accept: 'application/json',
    'user-agent': 'perch',
    ...lowercaseKeys(config.headers),
  };

  async function fetch(request: EndpointRequest): Promise<UpstreamResult> {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), config.timeout_ms);
    try {
      const response = await dispatcher.request({ origin, path: request.path, method: 'GET', headers, signal: abort.signal });
      return await readResult(request, response, config, options.clock);
    } catch (error) {
      if (abort.signal.aborted) return { kind: 'timeout', reason: `no complete answer within ${config.timeout_ms} ms` };
      return { kind: 'failed', failure: 'connection', reason: describe(error) };
    } finally {
      clearTimeout(timer);
    }
  }

  return {
    name,
    fetch,
    close: () => dispatcher.close(),
  };
}

async function readResult(
  request: EndpointRequest,
  response: Dispatcher.ResponseData,
  config: V1UpstreamConfig,
  clock: Clock,
): Promise<UpstreamResult> {
  const { statusCode } = response;
  if (statusCode >= 200 && statusCode < 300) {
    const body = await readLimited(response.body, config.max_body_bytes);
    if (body === undefined) return failed('bad_body', `body larger than ${config.max_body_bytes} bytes`);
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString('utf8'));
    } catch {
      return failed('bad_body', `status ${statusCode} with a body that is not JSON`);
    }
    if (!hasEndpointShape(request.endpoint, parsed)) {
      return failed('bad_body', `status ${statusCode} with a body lacking the ${request.endpoint} envelope`);
    }
    return { kind: 'ok', body };
  }
  // Error bodies are never read into memory, let alone forwarded.
  await response.body.dump();
  if (statusCode === 404) return { kind: 'not_found' };
  if (statusCode === 429) {
    const seconds = retryAfterSeconds(
      header(response.headers['retry-after']),
      header(response.headers['x-rate-limit-reset']),
      clock.now(),
      config.retry_after_default_seconds,
    );
    return { kind: 'rate_limited', retryAfterSeconds: seconds };
  }
  // perch validated every parameter but the opaque cursor, so a 400 on a request with a cursor
  // is the client's cursor; without one it is a disagreement between perch and the provider.
  if (statusCode === 400 && request.cursor !== undefined) return { kind: 'bad_request', reason: 'status 400 on a cursor' };
  if (statusCode === 401 || statusCode === 403) return failed('unauthorized', `status ${statusCode}: the provider rejected perch's credentials`);
  if (statusCode >= 500) return failed('status_5xx', `status ${statusCode}`);
  return failed('unexpected_status', `status ${statusCode}`);
}

/** Reads a body up to `max` bytes; undefined (and the connection released) when it is larger. */
async function readLimited(body: Dispatcher.ResponseData['body'], max: number): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let length = 0;
  for await (const chunk of body) {
    length += (chunk as Buffer).length;
    if (length > max) {
      body.destroy();
      return undefined;
    }
    chunks.push(chunk as Buffer);
  }
  return ownedBytes(chunks, length);
}

function failed(failure: 'bad_body' | 'unauthorized' | 'status_5xx' | 'unexpected_status', reason: string): UpstreamResult {
  return { kind: 'failed', failure, reason };
}

function header(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

function lowercaseKeys(record: Readonly<Record<string, string>>): Record<string, string> {
  return Object.fromEntries(Object.entries(record).map(([k, v]) => [k.toLowerCase(), v]));
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return typeof code === 'string' ? `${code}: ${error.message}` : error.message;
  }
  return String(error);
}
