import type { Logger } from '../logging/logger.js';
import type { Breaker } from './breaker.js';

/** What a caller hears about the shared path, beside what the breaker counts. */
export interface InsuranceHooks {
  failed(error: unknown): void;
  recovered?(): void;
  /** The breaker did not let the shared path be asked. */
  skipped?(): void;
}

/**
 * "Redis decides while it answers; this instance's memory decides while it does not": the one
 * shape of every Redis-backed subsystem (cache tier, token buckets, provider guard). The breaker
 * stops asking a Redis that keeps failing, so an outage costs a request nothing: while it is open
 * `local` answers synchronously, no await. A failed shared call moves the breaker and is answered
 * by `local` too, so Redis trouble can only make perch less shared, never fail a request.
 */
export function insured<T>(breaker: Breaker, shared: () => Promise<T>, local: () => T, hooks?: InsuranceHooks): T | Promise<T> {
  if (!breaker.allow()) {
    hooks?.skipped?.();
    return local();
  }
  return shared().then(
    (answer) => {
      breaker.success();
      hooks?.recovered?.();
      return answer;
    },
    (error: unknown) => {
      breaker.failure();
      hooks?.failed(error);
      return local();
    },
  );
}

/**
 * Logs the switch between shared and per-instance state once each way, not once per request:
 * an outage would otherwise write a line for every request it touches.
 */
export class SwitchLog implements InsuranceHooks {
  readonly #logger: Logger;
  readonly #down: string;
  readonly #up: string;
  #failing = false;

  constructor(logger: Logger, messages: { down: string; up: string }) {
    this.#logger = logger;
    this.#down = messages.down;
    this.#up = messages.up;
  }

  failed(error: unknown): void {
    if (this.#failing) return;
    this.#failing = true;
    this.#logger.warn({ reason: error instanceof Error ? error.message : String(error) }, this.#down);
  }

  recovered(): void {
    if (!this.#failing) return;
    this.#failing = false;
    this.#logger.info(this.#up);
  }
}

/**
 * A `SwitchLog` per node breaker, its lines naming the node: with a Redis Cluster one node down
 * is one switch, logged once, whatever the healthy nodes answer meanwhile. One log for all nodes
 * went back and forth with every call: a healthy node's answer logged "answers again", the dead
 * node's next skipped call "failed" (18 lines for 20 requests of two keys on two nodes).
 */
export class NodeSwitchLogs {
  readonly #logger: Logger;
  readonly #messages: { down: string; up: string };
  readonly #logs = new WeakMap<Breaker, SwitchLog>();

  constructor(logger: Logger, messages: { down: string; up: string }) {
    this.#logger = logger;
    this.#messages = messages;
  }

  for(breaker: Breaker): SwitchLog {
    let log = this.#logs.get(breaker);
    if (log === undefined) {
      log = new SwitchLog(breaker.node === undefined ? this.#logger : this.#logger.child({ node: breaker.node }), this.#messages);
      this.#logs.set(breaker, log);
    }
    return log;
  }
}
