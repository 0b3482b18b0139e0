import { INVALID, notFoundSubject, type EndpointName } from '../endpoints.js';
import { ERROR_MESSAGES, ERROR_TABLE, errorBody, type ErrorCode } from '../errors/error-table.js';
import { isWaitRefusal, secondsUntil, type UpstreamResult } from './upstream.js';

/**
 * What the client is told about one upstream result. The only place an `UpstreamResult` becomes
 * a status: upstream bodies other than a validated success never reach a client, and every
 * failure leaves in the error table's shape.
 */
export interface UpstreamAnswer {
  readonly status: number;
  readonly body: Buffer;
  readonly retryAfterSeconds?: number;
  /** Which TTL keeps it in the cache: the endpoint's (a 200), `not_found` (a 404), or none. */
  readonly ttl?: 'endpoint' | 'not_found';
}

const NOT_FOUND_BODIES = {
  user: errorBody('E404', ERROR_MESSAGES.userNotFound),
  tweet: errorBody('E404', ERROR_MESSAGES.tweetNotFound),
} as const;

/**
 * `passThrough`: the call carried the client's own key (`auth.mode: upstream`), so a 401/403 is
 * about that key and the client is told so; for perch's own credentials it is perch's problem.
 */
export function answerFor(endpoint: EndpointName, result: UpstreamResult, nowMs: number, passThrough: boolean): UpstreamAnswer {
  switch (result.kind) {
    case 'ok':
      return { status: 200, body: result.body, ttl: 'endpoint' };
    case 'not_found':
      return { status: 404, body: NOT_FOUND_BODIES[notFoundSubject(endpoint)], ttl: 'not_found' };
    case 'bad_request':
      return errorAnswer('E400', INVALID.cursor);
    case 'rate_limited':
      return { ...errorAnswer('E429'), retryAfterSeconds: secondsUntil(result.untilMs, nowMs) };
    case 'refused':
      // perch made no call: a "wait" the client can act on is a 429, a miss out of time a 504
      // like any timeout, anything else an upstream error.
      if (result.reason === 'no_time') return errorAnswer('E504');
      return isWaitRefusal(result.reason) ? { ...errorAnswer('E429'), retryAfterSeconds: result.retryAfterSeconds } : errorAnswer('E502');
    case 'failed':
      // A pass-through call's key is the client's: a provider refusing it is the client's 401.
      return errorAnswer(passThrough && (result.failure === 'unauthorized' || result.failure === 'forbidden') ? 'E401' : 'E502');
    case 'timeout':
      return errorAnswer('E504');
  }
}

export function errorAnswer(code: ErrorCode, message?: string): UpstreamAnswer {
  return { status: ERROR_TABLE[code].status, body: errorBody(code, message) };
}
