import type { Clock } from '../clock.js';
import type { ProviderCallBudget } from '../config/types.js';
import type { UpstreamEvents } from './events.js';
import type { ProviderState, SpendQuery } from './guard/provider-state.js';
import { secondsUntil, type Layer } from './upstream.js';

export interface BudgetOptions {
  readonly upstream: string;
  readonly state: ProviderState;
  readonly clock: Clock;
  readonly events: UpstreamEvents;
}

/** The UTC calendar window of `window` that holds `nowMs`: `[startMs, endMs)`. */
export function budgetWindow(window: ProviderCallBudget['window'], nowMs: number): { startMs: number; endMs: number } {
  const now = new Date(nowMs);
  const [year, month, day, hour] = [now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate(), now.getUTCHours()];
  switch (window) {
    case 'hour':
      return { startMs: Date.UTC(year, month, day, hour), endMs: Date.UTC(year, month, day, hour + 1) };
    case 'day':
      return { startMs: Date.UTC(year, month, day), endMs: Date.UTC(year, month, day + 1) };
    case 'month':
      return { startMs: Date.UTC(year, month, 1), endMs: Date.UTC(year, month + 1, 1) };
  }
}

/**
 * Each client key's budget of provider calls (`rate_limits.<plan>.provider_calls`) over the
 * current UTC calendar window. It sits just above the guard, so every real call counts, retries
 * and credential switches included, and only real calls do: a call the guard refuses is given
 * back. Once a key's budget is spent its calls are refused (`budget_spent`, a 429 whose
 * Retry-After is the rest of the window) without asking the store again until the window ends.
 */
export function createBudget(options: BudgetOptions): Layer {
  const { upstream, state, clock, events } = options;
  /** Windows known spent, key id and window start -> its end. */
  const spent = new Map<string, number>();

  function refuse(route: Parameters<UpstreamEvents['refused']>[1], endMs: number) {
    events.refused(upstream, route, 'budget_spent');
    return { kind: 'refused', reason: 'budget_spent', retryAfterSeconds: secondsUntil(endMs, clock.now()) } as const;
  }

  return (next) => async (attempt) => {
    const budget = attempt.payer?.budget;
    if (budget === undefined) return next(attempt);
    const { startMs, endMs } = budgetWindow(budget.window, clock.now());
    const memo = `${attempt.payer!.id}\n${startMs}`;
    if (spent.has(memo)) return refuse(attempt.request.endpoint, endMs);
    const query: SpendQuery = { keyId: attempt.payer!.id, startMs, endMs, limit: budget.limit };
    const spend = await state.spend(query);
    if (!spend.allowed) {
      if (spent.size > 10_000) for (const [key, end] of spent) if (end <= clock.now()) spent.delete(key);
      spent.set(memo, endMs);
      return refuse(attempt.request.endpoint, endMs);
    }
    const result = await next(attempt);
    if (result.kind === 'refused') state.refund(query);
    return result;
  };
}
