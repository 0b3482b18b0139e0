/**
 * The least of the miss deadline that must be left for perch to start a call (a failover, a
 * retry, a call out of the provider's queue). A call with less could not be answered in time:
 * the provider would bill it, perch would abandon it, and its timeout would be counted against
 * an upstream that did nothing wrong. 50 ms is above a provider's usual round trip on the same
 * continent and far below any `timeout_ms` worth configuring.
 */
export const MIN_CALL_MS = 50;

/**
 * The floor for a `miss_deadline_ms`: `MIN_CALL_MS`, or a tenth of a deadline shorter than
 * 500 ms, so that a deadline configured that short still lets its first call out.
 */
export function callFloorMs(deadlineMs: number): number {
  return Math.min(MIN_CALL_MS, Math.floor(deadlineMs / 10));
}

/**
 * What a batch window must leave of a miss's deadline, with `floorMs` its floor: the floor twice
 * over, so that the window ends a floor before the miss's own wait for company runs out (batch.ts)
 * even when both timers are late, and never less than `MIN_CALL_MS`, so that waiting for company
 * never leaves a call less than a provider's usual round trip, however short the deadline.
 */
export function windowLeavesMs(floorMs: number): number {
  return Math.max(2 * floorMs, MIN_CALL_MS);
}
