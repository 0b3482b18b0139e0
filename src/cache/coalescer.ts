/** One task in flight: how many callers still wait on it, and how to tell it none does. */
interface Flight<T> {
  readonly promise: Promise<T>;
  readonly stop: AbortController;
  /** Callers still waiting; Infinity once one that cannot leave (no signal) joined. */
  waiting: number;
}

/**
 * Collapses concurrent identical work: while a task for a key is in flight, later callers for
 * the same key get the same promise instead of starting their own. This is what keeps a burst
 * of identical misses down to one upstream request.
 */
export class Coalescer<T> {
  readonly #inFlight = new Map<string, Flight<T>>();

  /**
   * Runs `task` unless one is in flight for `key`; `leader` tells which of the two happened.
   * `left`: aborted when this caller stops waiting (its client went away). Once every caller of
   * a flight has, the task's signal is aborted; a caller without `left` waits to the end.
   */
  run(key: string, task: (stop: AbortSignal) => Promise<T>, left?: AbortSignal): { promise: Promise<T>; leader: boolean } {
    const existing = this.#inFlight.get(key);
    if (existing !== undefined) {
      this.#wait(existing, left);
      return { promise: existing.promise, leader: false };
    }
    const stop = new AbortController();
    const flight: Flight<T> = { promise: task(stop.signal).finally(() => this.#inFlight.delete(key)), stop, waiting: 0 };
    this.#inFlight.set(key, flight);
    this.#wait(flight, left);
    return { promise: flight.promise, leader: true };
  }

  get size(): number {
    return this.#inFlight.size;
  }

  #wait(flight: Flight<T>, left: AbortSignal | undefined): void {
    if (left === undefined) {
      flight.waiting = Infinity;
      return;
    }
    const leave = () => {
      if (--flight.waiting === 0) flight.stop.abort();
    };
    flight.waiting++;
    if (left.aborted) return leave();
    left.addEventListener('abort', leave, { once: true });
    void flight.promise.finally(() => left.removeEventListener('abort', leave)).catch(() => {});
  }
}
