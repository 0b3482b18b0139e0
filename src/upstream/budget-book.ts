import type { Clock } from '../clock.js';
import type { ProviderCallBudget } from '../config/types.js';
import { budgetWindow } from './budget-window.js';

/** What this instance last learned of one key's budget in the current window. */
export interface BudgetStanding {
  readonly limit: number;
  readonly remaining: number;
  /** The window's length and what is left of it, in whole seconds (the IETF `w` and `t`). */
  readonly windowSeconds: number;
  readonly resetSeconds: number;
}

/** Entries the book may hold before its first sweep of ended windows. */
const FIRST_SWEEP = 64;

/**
 * Each key's provider-call budget as this instance last learned it: every call the budget layer
 * charges reads the fleet's count, and the answers, the metrics and the status page show the
 * latest. Between this instance's calls for a key, other instances' calls are not seen: the
 * figure errs towards more left, never less, and the store decides every call.
 *
 * An entry lives as long as its window: one whose window has ended says no more than no entry
 * (the whole budget), so it is dropped. The book sweeps when it grows to twice what the last
 * sweep left (at least `FIRST_SWEEP`), and before every listing: between calls it holds fewer
 * than `max(FIRST_SWEEP, 2 x the entries the last sweep left)`, whatever the churn of client
 * ids, and the gauges never list an ended window (a key shows again at its next call).
 */
export class BudgetBook {
  readonly #clock: Clock;
  readonly #used = new Map<string, { startMs: number; endMs: number; used: number; label: string; budget: ProviderCallBudget }>();
  #sweepAt = FIRST_SWEEP;

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  /** A call was charged (or refused) with `used` calls counted in the window of `startMs`. */
  record(keyId: string, label: string, budget: ProviderCallBudget, startMs: number, used: number): void {
    const known = this.#used.get(keyId);
    if (known !== undefined && known.startMs === startMs && known.used >= used) return;
    this.#used.set(keyId, { startMs, endMs: budgetWindow(budget.window, startMs).endMs, used, label, budget });
    if (this.#used.size >= this.#sweepAt) this.#sweep();
  }

  /** Entries held now. */
  get size(): number {
    return this.#used.size;
  }

  #sweep(): void {
    const now = this.#clock.now();
    for (const [keyId, entry] of this.#used) if (entry.endMs <= now) this.#used.delete(keyId);
    this.#sweepAt = Math.max(FIRST_SWEEP, 2 * this.#used.size);
  }

  /** `budget`'s standing for `keyId` now: the whole budget in a window nothing was learned of. */
  standing(keyId: string, budget: ProviderCallBudget): BudgetStanding {
    const now = this.#clock.now();
    const { startMs, endMs } = budgetWindow(budget.window, now);
    const known = this.#used.get(keyId);
    const used = known !== undefined && known.startMs === startMs ? known.used : 0;
    return {
      limit: budget.limit,
      remaining: Math.max(0, budget.limit - used),
      windowSeconds: Math.round((endMs - startMs) / 1000),
      resetSeconds: Math.max(1, Math.ceil((endMs - now) / 1000)),
    };
  }

  /** Every key learned of, by metrics label, with its standing now: for the gauges and the status page. */
  all(): { label: string; standing: BudgetStanding }[] {
    this.#sweep();
    return [...this.#used.entries()].map(([keyId, { label, budget }]) => ({ label, standing: this.standing(keyId, budget) }));
  }
}
