// The calendar windows of provider-call budgets, shared by the budget layer and the book.
import type { ProviderCallBudget } from '../config/types.js';

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
