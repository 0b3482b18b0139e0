/**
 * Collapses concurrent identical work: while a task for a key is in flight, later callers for
 * the same key get the same promise instead of starting their own. This is what keeps a burst
 * of identical misses down to one upstream request.
 */
export class Coalescer<T> {
  readonly #inFlight = new Map<string, Promise<T>>();

  /** Runs `task` unless one is in flight for `key`; `leader` tells which of the two happened. */
  run(key: string, task: () => Promise<T>): { promise: Promise<T>; leader: boolean } {
    const existing = this.#inFlight.get(key);
    if (existing !== undefined) return { promise: existing, leader: false };
    const promise = task().finally(() => this.#inFlight.delete(key));
    this.#inFlight.set(key, promise);
    return { promise, leader: true };
  }

  get size(): number {
    return this.#inFlight.size;
  }
}
