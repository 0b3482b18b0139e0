/**
 * Waiting, injected like the clock: layers that wait (a queue for the call cap, backoff between
 * retries) ask this, so tests move time with `ManualClock.advance` instead of sleeping.
 */
export interface Timers {
  /** Runs `fn` after `ms`; the returned function cancels it. Never keeps the process alive. */
  after(ms: number, fn: () => void): () => void;
}

export const systemTimers: Timers = {
  after(ms, fn) {
    const timer = setTimeout(fn, ms);
    timer.unref();
    return () => clearTimeout(timer);
  },
};

/** A promise settled after `ms` on `timers`, or at once when `ms` is not positive. */
export function wait(timers: Timers, ms: number): Promise<void> {
  if (ms <= 0) return Promise.resolve();
  return new Promise((resolve) => timers.after(ms, resolve));
}
