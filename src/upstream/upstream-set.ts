import type { Dispatcher } from 'undici';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { EndpointName, EndpointRequest } from '../endpoints.js';
import type { Logger } from '../logging/logger.js';
import type { Timers } from '../timers.js';
import { buildUpstream, type BuiltUpstream, type UpstreamStatus } from './chain.js';
import type { GuardQueues } from './guard.js';
import type { BudgetBook } from './budget-book.js';
import type { UpstreamEvents } from './events.js';
import type { ProviderState } from './guard/provider-state.js';
import { callFloorMs, isPayerRefusal, isWaitRefusal, msLeft, wasCalled, type Attempt, type UpstreamResult } from './upstream.js';

/** The answer that decided a request, with who gave it and how long the exchange took. */
export interface RoutedResult {
  readonly result: UpstreamResult;
  readonly upstream: string;
  readonly ms: number;
  /** Whether any upstream of the route was really called (not every attempt refused). */
  readonly called: boolean;
  /**
   * Whether an upstream of the route was skipped for a refusal of the payer's own (its budget
   * spent): a call for another key might have gone further, so the result is only this payer's.
   */
  readonly payerRefused: boolean;
}

export interface UpstreamSetOptions {
  readonly clock: Clock;
  readonly timers: Timers;
  readonly logger: Logger;
  /** Cool-downs and call caps; outlives the set, so a reload keeps what the provider said. */
  readonly state: ProviderState;
  /** Per-upstream dispatcher override, by upstream name (tests inject faults this way). */
  readonly dispatchers?: Readonly<Record<string, Dispatcher>>;
  /** Told about every exchange, failover attempts included. */
  readonly metrics?: UpstreamEvents;
  /** The throttles' shedding draw, [0, 1); default Math.random. */
  readonly random?: () => number;
  /** This instance's record of each key's provider-call budget, kept across reloads. */
  readonly budgets?: BudgetBook;
  /** The guards' admission queues, kept across reloads. */
  readonly queues?: GuardQueues;
}

/**
 * The configured upstreams and the per-endpoint order to try them in. Each upstream is a stack
 * of layers (chain.ts); this class only walks a route. A request moves to the next upstream when
 * the current one cannot answer it now (it failed, timed out, said "stop", or perch refused to
 * call it); an answer about the request itself (found, not found, bad cursor) is final, because
 * another provider would say the same. With less than `MIN_CALL_MS` of the miss deadline left (`callFloorMs`),
 * the walk ends there: the miss is a timeout (504), and the upstream not called is charged
 * nothing, its breaker and throttle least of all.
 */
export class UpstreamSet {
  readonly #upstreams: ReadonlyMap<string, BuiltUpstream>;
  readonly #routes: Config['routes'];
  readonly #metrics: UpstreamSetOptions['metrics'];
  readonly #logger: Logger;
  readonly #deadlineMs: number;
  readonly #minCallMs: number;
  #inFlight = 0;
  #drained: (() => void) | undefined;

  constructor(config: Config, options: UpstreamSetOptions) {
    const upstreams = new Map<string, BuiltUpstream>();
    for (const [name, upstream] of Object.entries(config.upstreams)) {
      upstreams.set(name, buildUpstream(name, upstream, { ...options, dispatcher: options.dispatchers?.[name] }));
    }
    this.#upstreams = upstreams;
    this.#routes = config.routes;
    this.#metrics = options.metrics;
    this.#logger = options.logger;
    this.#deadlineMs = config.server.miss_deadline_ms;
    this.#minCallMs = callFloorMs(this.#deadlineMs);
  }

  /**
   * `clientKey`: pass-through auth, the client's own key as the credential of every call; with
   * `whoAmI` only the route's first upstream is asked (`tellsUserContext`).
   * `payer`: the client key whose miss this is, for a fair share of the call cap.
   * `trace`: the request's span, the parent of the spans the layers make.
   * `deadline`: when the miss began waiting for anything (another instance's flight, say), plus
   * `miss_deadline_ms`; from now when absent.
   */
  async fetch(request: EndpointRequest, clientKey?: Attempt['clientKey'], payer?: Attempt['payer'], trace?: Attempt['trace'], deadline = performance.now() + this.#deadlineMs): Promise<RoutedResult> {
    this.#inFlight++;
    try {
      const route = clientKey?.whoAmI === true ? this.#routes[request.endpoint].slice(0, 1) : this.#routes[request.endpoint];
      let decided: RoutedResult | undefined;
      let called = false;
      let payerRefused = false;
      for (const [i, name] of route.entries()) {
        // No call without time to answer it: the next upstream would bill a call perch abandons,
        // and count its timeout against a provider that did nothing wrong.
        if (msLeft(deadline) < this.#minCallMs) {
          this.#metrics?.refused(name, request.endpoint, 'no_time');
          this.#logger.warn({ upstream: name, route: request.endpoint, reason: 'no_time', deadline_ms: this.#deadlineMs }, 'miss deadline reached: upstream not called');
          return { result: { kind: 'refused', reason: 'no_time', retryAfterSeconds: 1 }, upstream: name, ms: 0, called, payerRefused };
        }
        const started = performance.now();
        const attempt: Attempt = {
          request,
          deadline,
          minCallMs: this.#minCallMs,
          ...(clientKey === undefined ? {} : { clientKey }),
          ...(payer === undefined ? {} : { payer }),
          ...(trace === undefined ? {} : { trace }),
        };
        const result = await this.#upstreams.get(name)!.call(attempt);
        const exchanged = wasCalled(result);
        called ||= exchanged;
        payerRefused ||= result.kind === 'refused' && isPayerRefusal(result.reason);
        const routed = { result, upstream: name, ms: performance.now() - started, called, payerRefused };
        // A batch call is one exchange, counted with its lead item's answer (or by the batch
        // layer when no item waited for it).
        if (exchanged && result.batched?.lead !== false) this.#metrics?.upstream(name, request.endpoint, result, routed.ms / 1000);
        decided = better(decided, routed);
        // A client's key the provider rejected is the client's answer: the next upstream would not
        // take it either, and trying costs a call.
        if (!movesOn(result) || (clientKey !== undefined && result.kind === 'failed' && (result.failure === 'unauthorized' || result.failure === 'forbidden'))) return routed;
        if (i < route.length - 1) this.#failover(name, request.endpoint, result, route[i + 1]!);
      }
      // Validation guarantees every route names at least one upstream.
      return { ...decided!, called, payerRefused };
    } finally {
      if (--this.#inFlight === 0) this.#drained?.();
    }
  }

  #failover(name: string, endpoint: EndpointName, result: UpstreamResult, next: string): void {
    const reason = reasonOf(result);
    this.#metrics?.failover(name, endpoint, reason);
    // A refusal repeats for every request while its stop lasts, and its start was logged once
    // by the layer that decided it: per request it is debug, like the metric's detail.
    const level = result.kind === 'refused' ? 'debug' : 'warn';
    this.#logger[level]({ upstream: name, route: endpoint, reason, next }, 'upstream failover');
  }

  /**
   * The answer perch makes itself to a request the first upstream of its route cannot match (an
   * id X cannot have): what a call would have got, as the walk ends on it (known-answer.ts).
   * Undefined: the request is the provider's to answer.
   */
  known(request: EndpointRequest): UpstreamResult | undefined {
    return this.#upstreams.get(this.#routes[request.endpoint][0]!)!.known?.(request);
  }

  /** Whether the first upstream of the endpoint's route tells a user's key from an app's (`Provider.tellsUserContext`). */
  tellsUserContext(endpoint: EndpointName): boolean {
    return this.#upstreams.get(this.#routes[endpoint][0]!)!.tellsUserContext === true;
  }

  /** Per upstream, whether it can be called now and why not, for `/readyz` and `/status`. */
  status(): Record<string, UpstreamStatus> {
    return Object.fromEntries([...this.#upstreams].map(([name, upstream]) => [name, upstream.status()]));
  }

  /** The upstreams of an endpoint's route that perch would call now. */
  usable(endpoint: EndpointName): string[] {
    return this.#routes[endpoint].filter((name) => this.#upstreams.get(name)!.status().state === 'ok');
  }

  /**
   * Waits for fetches already started (a failover may still need the next upstream of the list),
   * then releases every connection. After a reload the old set is closed this way while the new
   * one already serves.
   */
  async close(): Promise<void> {
    if (this.#inFlight > 0) await new Promise<void>((resolve) => (this.#drained = resolve));
    await Promise.all([...this.#upstreams.values()].map((u) => u.close()));
  }
}

function movesOn(result: UpstreamResult): boolean {
  return result.kind === 'failed' || result.kind === 'timeout' || result.kind === 'rate_limited' || result.kind === 'refused';
}

/** A result kind, or the failure or refusal reason: the `reason` of failover logs and metrics. */
export function reasonOf(result: UpstreamResult): string {
  if (result.kind === 'failed') return result.failure;
  if (result.kind === 'refused') return result.reason;
  return result.kind;
}

/**
 * Which of two results that could not serve the request to tell the client: a "wait" (429 with
 * Retry-After) tells the client when to come back, so it beats a plain failure, and the shortest
 * wait beats a longer one; otherwise the later attempt stands.
 */
function better(previous: RoutedResult | undefined, next: RoutedResult): RoutedResult {
  if (previous === undefined) return next;
  const a = waitSeconds(previous.result);
  const b = waitSeconds(next.result);
  if (a !== undefined && (b === undefined || a <= b)) return previous;
  return next;
}

function waitSeconds(result: UpstreamResult): number | undefined {
  if (result.kind === 'rate_limited') return result.retryAfterSeconds;
  return result.kind === 'refused' && isWaitRefusal(result.reason) ? result.retryAfterSeconds : undefined;
}
