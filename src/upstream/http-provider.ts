import { promisify } from 'node:util';
import { brotliDecompress, gunzip, inflate, type ZlibOptions } from 'node:zlib';
import { Pool, type Dispatcher } from 'undici';
import type { Clock } from '../clock.js';
import type { V1UpstreamConfig, XV2UpstreamConfig } from '../config/types.js';
import { ownedBytes } from '../bytes.js';
import type { EndpointRequest } from '../endpoints.js';
import { providerLimit } from './provider-limit.js';
import { rateLimitUntil } from './retry-after.js';
import { msLeft, secondsUntil, type Attempt, type Provider, type SealedBatch, type UpstreamFailure, type UpstreamResult } from './upstream.js';

export interface HttpProviderOptions {
  readonly clock: Clock;
  /**
   * Where requests go. Default: an undici Pool on `config.url` with `config.connections`
   * keep-alive connections. Tests and embedders inject their own to shape faults.
   */
  readonly dispatcher?: Dispatcher;
}

/**
 * What differs between the HTTP providers perch speaks to: where a request goes and what a 2xx
 * JSON body means. Everything else (credentials, timeouts, statuses, rate-limit headers, problem
 * bodies) is one protocol, so the layers above see the same results whatever the dialect.
 */
export interface Dialect {
  /** The provider's path and query for a validated request. */
  path(request: EndpointRequest): string;
  /**
   * The answer to a request the provider is known to refuse, without calling it: a parameter
   * perch accepts but the provider's own rules cannot match. Undefined: make the call. Answered
   * above every layer (known-answer.ts), never here.
   */
  known?(request: EndpointRequest): UpstreamResult | undefined;
  /**
   * Statuses that mean the credential itself was rejected, which takes it out of the rotation
   * until its recheck or a reload. Any other 4xx is a failure of this one call.
   */
  readonly rejectsCredential: readonly number[];
  /** Statuses that refuse one endpoint to a credential that serves the others. */
  readonly forbidsEndpoint?: readonly number[];
  /**
   * The path that answers a credential speaking for a user, and no other: a call with
   * `clientKey.whoAmI` goes there, and its 2xx is `ok` without a body. Absent: the provider cannot tell.
   */
  readonly whoAmI?: string;
  /** A 2xx body that parsed as JSON, to a result; `raw` is the exact bytes received. */
  success(request: EndpointRequest, parsed: unknown, raw: Buffer, status: number): UpstreamResult;
  /** Batch lookups (batch.ts): one call for several requests of one endpoint. Absent: the dialect has none. */
  readonly batch?: {
    path(requests: readonly EndpointRequest[]): string;
    /** A 2xx body to the call's result, carrying each item's own in `items`, in the order of `requests`. */
    success(requests: readonly EndpointRequest[], parsed: unknown, status: number): UpstreamResult;
  };
}

/** Enough of a 429 body to read a problem `type`; the rest is never read. */
const PROBLEM_BYTES = 4096;

/**
 * An HTTP provider in a given dialect: the innermost layer of a `v1` or `x_v2` upstream. perch
 * builds each request from scratch (the dialect's path, the credential's headers), so nothing of
 * the client's request, its key least of all, reaches the provider, and reduces each answer to an
 * `UpstreamResult`, so nothing of the provider's error bodies or headers reaches the client.
 */
export function createHttpProvider(name: string, config: V1UpstreamConfig | XV2UpstreamConfig, dialect: Dialect, options: HttpProviderOptions): Provider {
  const dispatcher = options.dispatcher ?? new Pool(config.url, { connections: config.connections, pipelining: 1 });
  const origin = config.url;
  const base: Record<string, string> = { accept: 'application/json', 'user-agent': 'perch' };
  // Built once per credential, not per call.
  const headersFor = new Map(config.credentials.map((c) => [c.id, { ...base, ...lowercaseKeys(c.headers) }]));

  async function call(attempt: Attempt): Promise<UpstreamResult> {
    const { credential } = attempt;
    // A batch call chooses its items now, on the wire; one item is the single lookup.
    const sealed = attempt.batch?.seal();
    const batch = sealed !== undefined && sealed.requests.length > 1 && dialect.batch !== undefined ? sealed : undefined;
    const request = sealed?.requests[0] ?? attempt.request;
    // A batch call answers its latest rider in time; a rider whose deadline comes sooner is
    // answered alone (batch.ts). The guard let the call go only with the floor of this left.
    const left = Math.max(1, msLeft(sealed?.deadline ?? attempt.deadline));
    const timeoutMs = Math.min(config.timeout_ms, left);
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), timeoutMs);
    // A credential not configured is a client's own key (pass-through): its headers only.
    const own = credential === undefined ? base : (headersFor.get(credential.id) ?? { ...base, ...credential.headers });
    const headers = attempt.traceHeaders === undefined ? own : { ...own, ...attempt.traceHeaders };
    const whoAmI = attempt.clientKey?.whoAmI === true ? dialect.whoAmI : undefined;
    try {
      const path = whoAmI ?? (batch === undefined ? dialect.path(request) : dialect.batch!.path(batch.requests));
      const response = await dispatcher.request({ origin, path, method: 'GET', headers, signal: abort.signal });
      const now = options.clock.now();
      const limit = providerLimit(response.headers, now);
      // Who the key speaks for is all a whoAmI call asks: its body (the user's own) is never read.
      const spoke = whoAmI !== undefined && response.statusCode >= 200 && response.statusCode < 300;
      if (spoke) await response.body.dump();
      const result: UpstreamResult = spoke ? { kind: 'ok', body: Buffer.alloc(0) } : await classify(request, response, config, dialect, now, batch);
      return limit === undefined ? result : { ...result, limit };
    } catch (error) {
      if (abort.signal.aborted) {
        const reason = `no complete answer within ${timeoutMs} ms`;
        return timeoutMs < config.timeout_ms ? { kind: 'timeout', reason: `${reason}, what was left of the miss deadline`, deadline: true } : { kind: 'timeout', reason };
      }
      return { kind: 'failed', failure: 'connection', reason: describe(error) };
    } finally {
      clearTimeout(timer);
    }
  }

  return {
    name,
    call,
    close: () => dispatcher.close(),
    ...(dialect.known === undefined ? {} : { known: (request: EndpointRequest) => dialect.known!(request) }),
    ...(dialect.whoAmI === undefined ? {} : { tellsUserContext: true }),
  };
}

async function classify(
  request: EndpointRequest,
  response: Dispatcher.ResponseData,
  config: V1UpstreamConfig | XV2UpstreamConfig,
  dialect: Dialect,
  now: number,
  batch: SealedBatch | undefined,
): Promise<UpstreamResult> {
  const { statusCode, headers } = response;
  if (statusCode >= 200 && statusCode < 300) {
    const received = await readLimited(response.body, config.max_body_bytes);
    if (received === undefined) return failed('bad_body', `body larger than ${config.max_body_bytes} bytes`, statusCode);
    const body = await decode(received, header(headers['content-encoding']), config.max_body_bytes);
    if (typeof body === 'string') return failed('bad_body', body, statusCode);
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString('utf8'));
    } catch {
      return failed('bad_body', `status ${statusCode} with a body that is not JSON`, statusCode);
    }
    return batch === undefined ? dialect.success(request, parsed, body, statusCode) : dialect.batch!.success(batch.requests, parsed, statusCode);
  }
  const retryAfter = header(headers['retry-after']);
  // The one error body perch reads, and only for its problem type: X answers a spent monthly
  // quota with a 429 whose remaining count is not 0, and only the type tells it apart. Clients
  // of X's API report the same type on 402 and 403 answers too; whatever the status, a spent
  // cap must stop the credential, or every miss would call it again.
  const capped = USAGE_CAP_STATUSES.has(statusCode) && isUsageCapped(await readLimited(response.body, PROBLEM_BYTES, true));
  if (capped || statusCode === 429 || (statusCode === 503 && retryAfter !== undefined)) {
    if (!capped) await response.body.dump().catch(() => undefined);
    const untilMs = rateLimitUntil(retryAfter, header(headers['x-rate-limit-reset']), now, config.retry_after_default_seconds);
    const cause = capped ? 'usage_capped' : statusCode === 429 ? 'status_429' : 'status_503';
    return { kind: 'rate_limited', cause, retryAfterSeconds: secondsUntil(untilMs, now), untilMs };
  }
  // Error bodies are never forwarded, and never read beyond that peek at a problem type.
  await response.body.dump().catch(() => undefined);
  // A batch lookup is never "not found" as a whole: that would be every item's answer.
  if (statusCode === 404 && batch === undefined) return { kind: 'not_found' };
  // perch validated every parameter but the opaque cursor, so a 400 on a request with a cursor
  // is the client's cursor; without one it is a disagreement between perch and the provider.
  // A batch's 400 is one of its items (X fails the whole call for one it cannot take): the batch
  // layer splits the call until that item is alone.
  if (statusCode === 400 && request.cursor !== undefined) return { kind: 'bad_request', reason: 'status 400 on a cursor' };
  if (statusCode === 400 && batch !== undefined) return { kind: 'bad_request', reason: `status 400 on a batch of ${batch.requests.length}`, batch: { proven: batch.proven } };
  if (dialect.rejectsCredential.includes(statusCode)) return failed('unauthorized', `status ${statusCode}: the provider rejected the credential`, statusCode);
  if (dialect.forbidsEndpoint?.includes(statusCode)) return failed('forbidden', `status ${statusCode}: the provider does not serve this endpoint to the credential`, statusCode);
  if (statusCode >= 500) return failed('status_5xx', `status ${statusCode}`, statusCode);
  // perch follows no redirect (the configured url is the provider's), but the operator needs its
  // target to fix the url: a provider that moved to https otherwise reads as a bare "status 301".
  const location = statusCode >= 300 && statusCode < 400 ? header(headers['location']) : undefined;
  if (location !== undefined) return failed('unexpected_status', `status ${statusCode}: redirect to ${location.slice(0, 200)} (perch follows none: fix the upstream's url)`, statusCode);
  return failed('unexpected_status', `status ${statusCode}`, statusCode);
}

const DECODERS: Readonly<Record<string, (body: Buffer, options: ZlibOptions) => Promise<Buffer>>> = {
  gzip: promisify(gunzip),
  'x-gzip': promisify(gunzip),
  br: promisify(brotliDecompress),
  deflate: promisify(inflate),
};

/**
 * A 2xx body in its `Content-Encoding` undone: perch asks for none, but an operator may add
 * `Accept-Encoding` to a credential's headers, and a provider may compress anyway. Decoded off
 * the event loop's thread (zlib's pool), and bounded by `max_body_bytes` on both sides, so a
 * small compressed body cannot expand past it. A string: why it cannot be read.
 */
async function decode(body: Buffer, coding: string | undefined, maxBytes: number): Promise<Buffer | string> {
  const name = coding?.trim().toLowerCase();
  if (name === undefined || name === '' || name === 'identity') return body;
  const decoder = DECODERS[name];
  if (decoder === undefined) return `content-encoding ${name.slice(0, 40)} is not one perch decodes (gzip, br, deflate)`;
  try {
    return await decoder(body, { maxOutputLength: maxBytes });
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    return code === 'ERR_BUFFER_TOO_LARGE' ? `body larger than ${maxBytes} bytes once ${name}-decoded` : `a ${name} body that does not decode`;
  }
}

/** Statuses whose problem body may name a spent usage cap. */
const USAGE_CAP_STATUSES = new Set([402, 403, 429]);

/** X's problem details name the spent monthly cap `https://api.twitter.com/2/problems/usage-capped`. */
function isUsageCapped(body: Buffer | undefined): boolean {
  if (body === undefined) return false;
  try {
    const problem: unknown = JSON.parse(body.toString('utf8'));
    const type = typeof problem === 'object' && problem !== null ? (problem as { type?: unknown }).type : undefined;
    return typeof type === 'string' && type.endsWith('/usage-capped');
  } catch {
    return false;
  }
}

/**
 * Reads a body up to `max` bytes. Larger: undefined and the connection released, or with
 * `truncate` the first `max` bytes (for a peek at an error body).
 */
async function readLimited(body: Dispatcher.ResponseData['body'], max: number, truncate = false): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let length = 0;
  try {
    for await (const chunk of body) {
      length += (chunk as Buffer).length;
      chunks.push(chunk as Buffer);
      if (length > max) {
        body.destroy();
        return truncate ? ownedBytes(chunks, length).subarray(0, max) : undefined;
      }
    }
  } catch (error) {
    if (truncate) return undefined;
    throw error;
  }
  // A body that came in one read is that read's own memory: node sizes each read's buffer to
  // what it read, and undici hands the body out as a view of it, the response's headers before
  // it. Copying it was one more allocation per miss outside V8's heap, garbage by the time the
  // entry is stored: the memory tier keeps a copy in its slabs (cache/slab-pool.ts) (issue 22).
  return chunks.length === 1 ? chunks[0] : ownedBytes(chunks, length);
}

/** A failure the provider answered with (not a connection failure), with its status. */
export function failed(failure: Exclude<UpstreamFailure, 'connection'>, reason: string, status: number): UpstreamResult {
  return { kind: 'failed', failure, reason, status };
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
