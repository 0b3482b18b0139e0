import type { Clock } from '../../src/clock.js';
import type { Timers } from '../../src/timers.js';

interface Pending {
  readonly at: number;
  readonly seq: number;
  readonly fn: () => void;
}

/**
 * A clock that moves only when the test says so, and the timers that go with it: `advance` runs,
 * in time order, every callback that falls due, so code that waits can be driven without sleeping.
 */
export class ManualClock implements Clock, Timers {
  #now: number;
  #pending: Pending[] = [];
  #seq = 0;

  constructor(start = Date.UTC(2026, 0, 1)) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  after(ms: number, fn: () => void): () => void {
    const entry = { at: this.#now + Math.max(0, ms), seq: this.#seq++, fn };
    this.#pending.push(entry);
    return () => {
      this.#pending = this.#pending.filter((p) => p !== entry);
    };
  }

  /** Callbacks waiting to fall due. */
  get waiting(): number {
    return this.#pending.length;
  }

  advance(ms: number): void {
    const target = this.#now + ms;
    for (;;) {
      const due = this.#pending.filter((p) => p.at <= target).sort((a, b) => a.at - b.at || a.seq - b.seq)[0];
      if (due === undefined) break;
      this.#pending = this.#pending.filter((p) => p !== due);
      this.#now = Math.max(this.#now, due.at);
      due.fn();
    }
    this.#now = target;
  }
}
