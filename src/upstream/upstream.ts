import type { ProviderCallBudget } from '../config/types.js';
import type { EndpointRequest } from '../endpoints.js';
import { MIN_CALL_MS } from '../config/call-floor.js';
import type { TraceSpan } from '../tracing/trace-span.js';

/**
 * What the provider said about its own rate limit on this exchange (`x-rate-limit-*` or the IETF
 * `RateLimit` fields): calls left in its window and when the window resets (epoch ms).
 */
export interface ProviderLimit {
  readonly remaining: number;
  readonly resetAtMs: number;
}

/**
 * Why perch did not call the provider at all. Closed, so logs, metrics and the client's answer
 * are picked from one place:
 * - `cooling_down`: the provider said "stop" (429, 503 with Retry-After, remaining at the reserve)
 *   for every credential this request could use;
 * - `usage_capped`: the provider's long quota (e.g. the monthly cap) is spent for every credential;
 * - `over_cap`: perch's own cap on calls to this upstream is reached and the queue wait ran out;
 * - `breaker_open`: the upstream keeps failing, so it is not called until its half-open probe;
 * - `throttled`: the upstream fails part of its calls, and the adaptive throttle sheds the share
 *   it would likely fail too (throttle.ts);
 * - `no_credential`: every credential was rejected (401/403) and left the rotation;
 * - `budget_spent`: the client key's plan allows no more provider calls in this calendar window;
 * - `no_time`: less than `MIN_CALL_MS` of the miss deadline was left (`callFloorMs`), too little for any answer:
 *   the client is told 504 (the miss ran out of time), and the upstream is charged nothing.
 */
export type RefusalReason = 'cooling_down' | 'usage_capped' | 'over_cap' | 'breaker_open' | 'throttled' | 'no_credential' | 'budget_spent' | 'no_time';

export { MIN_CALL_MS, callFloorMs, windowLeavesMs } from '../config/call-floor.js';

/** The floor an attempt carries, `MIN_CALL_MS` where none was set. */
export function floorOf(attempt: Attempt): number {
  return attempt.minCallMs ?? MIN_CALL_MS;
}

/**
 * The deadline a call must meet: a batch call's once its items are chosen (the latest of theirs),
 * else its miss's. The guard and the retries weigh this one, so that no call, a batch's retry
 * included, leaves with less than the floor of it.
 */
export function deadlineOf(attempt: Attempt): number {
  return attempt.batch?.sealed?.deadline ?? attempt.deadline;
}

/** Whole milliseconds left before `deadline` (`performance.now()` time); negative once past. */
export function msLeft(deadline: number): number {
  return Math.floor(deadline - performance.now());
}

/**
 * The refusals that are a "wait": the client may come back after `retryAfterSeconds` (429 with
 * Retry-After). The others say the upstream cannot serve now (502), with no time to give.
 */
export function isWaitRefusal(reason: RefusalReason): boolean {
  return reason === 'cooling_down' || reason === 'usage_capped' || reason === 'over_cap' || reason === 'budget_spent';
}

/**
 * The refusals that belong to the paying key, not to the provider or to perch's shared limits:
 * another key's call would not meet them. A flight's followers of other keys must not be given
 * one (read-through.ts): they make or join a call of their own instead.
 */
export function isPayerRefusal(reason: RefusalReason): boolean {
  return reason === 'budget_spent';
}

/** What made a 429-like answer: a plain 429, a 503 with Retry-After, or the spent usage cap. */
export type RateLimitCause = 'status_429' | 'status_503' | 'usage_capped';

/**
 * What one upstream exchange produced, already reduced to what perch acts on. Upstream bodies
 * other than a validated success never travel further than this: errors carry a reason for the
 * log and nothing the client will see. `credential` names the credential the call used (never
 * its secret) and `limit` what the provider reported about its window, for the layers above.
 */
export type UpstreamResult = (
  /** 2xx with a JSON body of the endpoint's shape; `body` is the exact bytes received (for `x_v2`, the v1 body mapped from them). */
  | { readonly kind: 'ok'; readonly body: Buffer }
  /**
   * The user or tweet does not exist (upstream 404). Cacheable. `unasked`: perch answered it
   * without a call, because the provider's own rules cannot match the request (known-answer.ts);
   * it is then no exchange, and says nothing about the credential or the key that asked.
   */
  | { readonly kind: 'not_found'; readonly unasked?: true }
  /**
   * The upstream rejected the request's cursor (upstream 400 on a request with a cursor), or a
   * batch call as a whole (`batch`: X refuses a batch for one item it cannot take). `proven`: a
   * call of two or more items of the same split was answered, so the provider serves calls of this
   * form and the 400 is about the items (verdict.ts).
   */
  | { readonly kind: 'bad_request'; readonly reason: string; readonly batch?: { readonly proven: boolean } }
  /**
   * The provider said "stop": 429, a 503 with Retry-After, or its usage cap. `retryAfterSeconds`
   * is whole seconds, at least 1; `untilMs` the same instant on the clock.
   */
  | { readonly kind: 'rate_limited'; readonly cause: RateLimitCause; readonly retryAfterSeconds: number; readonly untilMs: number }
  /**
   * Anything perch cannot serve: 5xx, refused or reset connection, bad body, 401/403. `status`
   * is the provider's HTTP status when it sent one.
   */
  | { readonly kind: 'failed'; readonly failure: UpstreamFailure; readonly reason: string; readonly status?: number }
  /**
   * No complete answer within the upstream's `timeout_ms`, or within what was left of the miss
   * deadline when that was shorter (`deadline` true): such a cut says nothing of the upstream's
   * health, so the breaker and the throttle do not count it (verdict.ts).
   */
  | { readonly kind: 'timeout'; readonly reason: string; readonly deadline?: true }
  /** perch made no call: see `RefusalReason`. `retryAfterSeconds` is whole seconds, at least 1. */
  | { readonly kind: 'refused'; readonly reason: RefusalReason; readonly retryAfterSeconds: number }
) & {
  readonly credential?: string;
  readonly limit?: ProviderLimit;
  /**
   * A batch call (`Attempt.batch` sealed with two items or more) that the provider answered as a
   * whole: each item's own result, in the order of `SealedBatch.requests`. Only the batch layer
   * reads it; every layer between sees the call's result, one call.
   */
  readonly items?: readonly UpstreamResult[];
  /**
   * The item's miss rode in a batch call of this many items; `lead` is the one item whose call
   * it was (its key's turn under the cap), the others rode along. Absent: a call of its own.
   */
  readonly batched?: { readonly size: number; readonly lead: boolean };
};

/**
 * Why an upstream exchange failed, a closed set so logs and metrics can count them.
 * `forbidden` is a provider refusing one endpoint to a credential that serves the others (X's
 * 403 for an endpoint outside the app's plan): neither the provider's health nor the credential's.
 * `unauthorized` is the provider rejecting perch's own credential (401/403): an operator problem,
 * logged as an error, never reported to the client as an invalid key. `bad_body` is a 2xx body
 * that is not JSON or is too large; `invalid_body` is JSON that fails the endpoint's schema, kept
 * apart because it usually means the provider changed its format, not that an exchange broke.
 * `mapping_gap` is a body of the right format that this one answer cannot be mapped from (X
 * left a tweet's author out of `includes`): the provider answered, so, like `forbidden`, it says
 * nothing about its health.
 */
export type UpstreamFailure = 'status_5xx' | 'connection' | 'bad_body' | 'invalid_body' | 'mapping_gap' | 'unauthorized' | 'forbidden' | 'unexpected_status';

/** One call down the layers of one upstream. Layers pass a modified copy, never mutate it. */
export interface Attempt {
  readonly request: EndpointRequest;
  /** `performance.now()` by which every layer must be done: queue, retries and the exchange. */
  readonly deadline: number;
  /** The least of the deadline that must be left to start a call (`callFloorMs`); absent: `MIN_CALL_MS`. */
  readonly minCallMs?: number;
  /**
   * Pass-through auth: the client's own key, sent in place of a configured credential, and the
   * id that names it in logs and provider stops. `verifying`: the provider has not accepted the
   * key on this endpoint lately, so its answer is about the key before it is about the provider.
   * `whoAmI`: instead of `request`, the call asks the provider who the key speaks for
   * (`Provider.tellsUserContext`): `ok`, without a body, says it speaks for a user.
   */
  readonly clientKey?: { readonly id: string; readonly key: string; readonly verifying?: boolean; readonly whoAmI?: boolean };
  /**
   * Chosen by the guard, or set from `clientKey` before any layer runs; the provider call sends
   * its headers.
   */
  readonly credential?: Credential;
  /** Credentials this attempt must not use (the pool sets it when switching credentials). */
  readonly avoid?: readonly string[];
  /** The breaker's half-open probe: the throttle never sheds it, or a healed provider would go unnoticed. */
  readonly probe?: boolean;
  /** Who the call is for: the guard shares the call cap fairly among payers. Absent: perch's own call. */
  readonly payer?: Payer;
  /** The span the layers hang theirs under (queue wait, each provider attempt); absent: not traced. */
  readonly trace?: TraceSpan;
  /** Which retry of the request this is (set by the retry layer); absent: the first attempt. */
  readonly retry?: number;
  /** `traceparent` and `tracestate` for the provider, when its upstream propagates the trace. */
  readonly traceHeaders?: Readonly<Record<string, string>>;
  /**
   * A call the batch layer (batch.ts) sends for the misses of one endpoint: `request` is its lead
   * item's, and the provider asks `seal()`, when the call goes on the wire, which items it
   * carries. Every layer between treats it as the one call it is.
   */
  readonly batch?: BatchTicket;
}

/** The items one batch call carries, fixed when it first goes on the wire. */
export interface SealedBatch {
  /** The lead item's request first; one request: the provider's single lookup, as without batching. */
  readonly requests: readonly EndpointRequest[];
  /**
   * The latest of the items' deadlines (`performance.now()` time): the call's own, which no
   * rider's shorter one cuts (a rider whose deadline passes is answered alone, batch.ts).
   */
  readonly deadline: number;
  /** A call of two or more of the same split was answered (batch-split.ts): a 400 on this one is about its items. */
  readonly proven: boolean;
}

export interface BatchTicket {
  /** The items, chosen at the first call and the same for a retry or a switch of credential. */
  seal(): SealedBatch;
  /** The items once chosen; undefined until the call first goes on the wire. */
  readonly sealed: SealedBatch | undefined;
  /**
   * The cap refuses the call for now and it waits in the cap's queue: the misses waiting for a
   * seat in it wait over the cap from now on, within `queue_timeout_ms`.
   */
  queued(): void;
}

/** Who a call is for: the client key whose miss makes it, and its plan's `provider_weight`. */
export interface Payer {
  readonly id: string;
  readonly weight: number;
  /** Its `key_id` in metrics: the configured id, or the one label all pass-through keys share. */
  readonly label: string;
  /** Its plan's `provider_calls`: how many provider calls it may make per calendar window. */
  readonly budget?: ProviderCallBudget;
}

/** A provider credential: the headers sent with a call, named by an id safe to log. */
export interface Credential {
  readonly id: string;
  readonly headers: Readonly<Record<string, string>>;
}

/** A call into the layers below. Never rejects: every failure is a result. */
export type Call = (attempt: Attempt) => Promise<UpstreamResult>;

/**
 * One capability around the call below it, the way undici's interceptors compose: it receives
 * the next call and returns a call of the same shape.
 */
export type Layer = (next: Call) => Call;

/** `layers[0]` is the outermost: `compose([a, b], call)` is `a(b(call))`. */
export function compose(layers: readonly Layer[], call: Call): Call {
  return layers.reduceRight((next, layer) => layer(next), call);
}

/**
 * Whether a call went out for this result: every kind but a refusal and an answer perch made
 * itself. Only these count as exchanges with the provider, in metrics and in what a miss paid.
 */
export function wasCalled(result: UpstreamResult): boolean {
  return result.kind !== 'refused' && !(result.kind === 'not_found' && result.unasked === true);
}

/** The innermost layer of an upstream: the provider's own dialect over the wire. */
export interface Provider {
  /** The name under `upstreams` in the config. */
  readonly name: string;
  /** Never rejects: every failure is a result. */
  readonly call: Call;
  /**
   * The answer to a request the provider is known to refuse, made without calling it (marked
   * `unasked`); undefined: the request goes down the layers. See known-answer.ts.
   */
  readonly known?: (request: EndpointRequest) => UpstreamResult | undefined;
  /**
   * Whether a call with `clientKey.whoAmI` tells a key that speaks for a user from one that speaks
   * for an app (X: `GET /2/users/me` answers user-context tokens only, app-only ones 403).
   */
  readonly tellsUserContext?: boolean;
  /** Releases connections; pending calls settle. */
  close(): Promise<void>;
}

/** Whole seconds from `nowMs` to `untilMs`, at least 1: what a client's Retry-After says. */
export function secondsUntil(untilMs: number, nowMs: number): number {
  return Math.max(1, Math.ceil((untilMs - nowMs) / 1000));
}
