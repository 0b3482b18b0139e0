/**
 * When memory given up by the cache may be written again. The memory tier hands out views of its
 * slabs (slab-pool.ts); a request that read one may still be sending it, or hold it across an
 * await, after the entry has been evicted. A region released while any request that began before
 * the release is still open must not be reused: the socket would send another entry's bytes.
 *
 * Two phases, as in read-copy-update: a request joins the current phase when it begins and leaves
 * it when its response closes. Regions released meanwhile wait. Once every request of the older
 * phase has left, the phases swap: what waited now waits only for the requests of the phase it
 * was released in, and what waited before that is reusable. A request costs two increments; a
 * release, a push. A request held open for long (a slow client, a miss on a slow upstream) holds
 * reuse back for that long; the pool then serves stores from memory of their own (slab-pool.ts).
 */
export class GracePeriods {
  #phase = 0;
  readonly #open = [0, 0];
  /** Released during the current phase: its requests and the older phase's may hold them. */
  #waiting: number[] = [];
  /** Released before the last swap: only the older phase's requests may still hold them. */
  #draining: number[] = [];
  readonly #reclaim: (region: number) => void;

  /** `reclaim` gets each region once no request that could have read it is open. */
  constructor(reclaim: (region: number) => void) {
    this.#reclaim = reclaim;
  }

  /** A request begins; what it returns goes back to `leave` when its response closes. */
  enter(): number {
    const phase = this.#phase;
    this.#open[phase]! += 1;
    return phase;
  }

  leave(phase: number): void {
    this.#open[phase]! -= 1;
    if (phase !== this.#phase && this.#open[phase] === 0) this.#advance();
  }

  /** `region` left the cache; it is reclaimed after the requests open now have closed. */
  release(region: number): void {
    this.#waiting.push(region);
    if (this.#open[this.#phase ^ 1] === 0) this.#advance();
  }

  /** Requests open now, for tests and the status page. */
  get open(): number {
    return this.#open[0]! + this.#open[1]!;
  }

  /** Regions released and not yet reclaimed. */
  get held(): number {
    return this.#waiting.length + this.#draining.length;
  }

  /** Called only when the older phase has no open request. */
  #advance(): void {
    do {
      const ready = this.#draining;
      for (const region of ready) this.#reclaim(region);
      ready.length = 0;
      // The emptied list becomes the new waiting one: a swap allocates nothing.
      this.#draining = this.#waiting;
      this.#waiting = ready;
      this.#phase ^= 1;
    } while (this.#open[this.#phase ^ 1] === 0 && this.#draining.length > 0);
  }
}
