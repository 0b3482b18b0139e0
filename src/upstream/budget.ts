import type { Clock } from '../clock.js';
import { BREAKER_COOL_DOWN_MS } from '../redis/breaker.js';
import type { BudgetBook } from './budget-book.js';
import { budgetWindow } from './budget-window.js';
import type { UpstreamEvents } from './events.js';
import type { ProviderState, SpendQuery } from './guard/provider-state.js';
import { secondsUntil, type Attempt, type Layer } from './upstream.js';

export interface BudgetOptions {
  readonly upstream: string;
  readonly state: ProviderState;
  readonly clock: Clock;
  readonly events: UpstreamEvents;
  /** Told every key's count as the store answers it, for the answers' headers and the metrics. */
  readonly book?: BudgetBook;
  /** The part of a budget this instance charges on its own while Redis is unreachable (`redis_down_share`). */
  readonly share?: number;
  /** The attempts this layer charges; absent: every one whose payer has a budget. */
  readonly charges?: (attempt: Attempt) => boolean;
}

/**
 * Each client key's budget of provider calls (`rate_limits.<plan>.provider_calls`) over the
 * current UTC calendar window. It sits just above the guard, so every real call counts, retries
 * and credential switches included, and only real calls do: a call the guard refuses is given
 * back. Once a key's budget is spent its calls are refused (`budget_spent`, a 429 whose
 * Retry-After is the rest of the window) without asking the store again until the window ends,
 * or until the key's limit is raised: the limit is read from the configuration on every call, so
 * a reload that raises it admits the next call, and one that lowers it refuses the next call.
 */
export function createBudget(options: BudgetOptions): Layer {
  const { upstream, state, clock, events, book } = options;
  /** Windows known spent, key id, window start and the limit they were spent at -> their end. */
  const spent = new Map<string, number>();

  function refuse(route: Parameters<UpstreamEvents['refused']>[1], endMs: number) {
    events.refused(upstream, route, 'budget_spent');
    return { kind: 'refused', reason: 'budget_spent', retryAfterSeconds: secondsUntil(endMs, clock.now()) } as const;
  }

  /** Over this instance's share while Redis is away: worth asking again once Redis may answer, not at the window's end. */
  function refuseForNow(route: Parameters<UpstreamEvents['refused']>[1], endMs: number) {
    const refused = refuse(route, endMs);
    return { ...refused, retryAfterSeconds: Math.min(refused.retryAfterSeconds, Math.ceil(BREAKER_COOL_DOWN_MS / 1000)) };
  }

  return (next) => async (attempt) => {
    const budget = attempt.payer?.budget;
    if (budget === undefined || options.charges?.(attempt) === false) return next(attempt);
    const { startMs, endMs } = budgetWindow(budget.window, clock.now());
    const memo = `${attempt.payer!.id}\n${startMs}\n${budget.limit}`;
    if (spent.has(memo)) return refuse(attempt.request.endpoint, endMs);
    const query: SpendQuery = { keyId: attempt.payer!.id, startMs, endMs, limit: budget.limit, ...(options.share === undefined ? {} : { share: options.share }) };
    const spend = await state.spend(query);
    // Refused short of the limit, the key is over this instance's share while Redis is away: the
    // window is not spent (the book, which never goes back down in a window, keeps the count),
    // and the next call asks again (Redis may be back).
    const overShare = !spend.allowed && spend.used < budget.limit;
    book?.record(query.keyId, attempt.payer!.label, budget, startMs, spend.allowed || overShare ? spend.used : budget.limit);
    if (!spend.allowed) {
      if (overShare) return refuseForNow(attempt.request.endpoint, endMs);
      if (spent.size > 10_000) for (const [key, end] of spent) if (end <= clock.now()) spent.delete(key);
      spent.set(memo, endMs);
      return refuse(attempt.request.endpoint, endMs);
    }
    const result = await next(attempt);
    if (result.kind === 'refused') state.refund(query, spend);
    return result;
  };
}
