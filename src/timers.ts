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

/** What `by` gives for a call still unanswered at the deadline. */
export const LATE = Symbol('late');
/** What `by` gives for a call still unanswered once nobody waits for it any more. */
export const GONE = Symbol('gone');

/**
 * `call`'s answer, or LATE once `deadline` (on `performance.now()`) passes first, or GONE once
 * `stop` is aborted first: a Redis call may take `command_timeout_ms`, and a wait for another
 * instance's turn longer still, which must not stretch a request's miss deadline, nor keep a
 * request whose clients all left waiting on a stalled Redis. The call goes on unobserved.
 */
export async function by<T>(call: Promise<T>, deadline: number, stop?: AbortSignal): Promise<T | typeof LATE | typeof GONE> {
  if (stop?.aborted === true) return GONE;
  if (deadline === Infinity && stop === undefined) return call;
  let timer: NodeJS.Timeout | undefined;
  let leave: (() => void) | undefined;
  const cut = new Promise<typeof LATE | typeof GONE>((resolve) => {
    if (deadline !== Infinity) timer = setTimeout(resolve, Math.max(0, deadline - performance.now()), LATE);
    leave = () => resolve(GONE);
    stop?.addEventListener('abort', leave, { once: true });
  });
  try {
    return await Promise.race([call, cut]);
  } finally {
    clearTimeout(timer);
    stop?.removeEventListener('abort', leave!);
  }
}
