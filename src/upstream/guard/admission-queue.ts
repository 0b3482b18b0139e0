import type { Clock } from '../../clock.js';
import type { Timers } from '../../timers.js';
import type { Admission } from './provider-state.js';

interface Waiter {
  readonly tryAdmit: () => Admission | Promise<Admission>;
  readonly finish: (admission: Admission) => void;
  cancelExpiry: () => void;
  expired: boolean;
}

/**
 * The bounded FIFO in front of an upstream's call cap. A call the cap cannot take now waits
 * here, at most `maxWaitMs`, and calls are admitted in arrival order: only the head asks the
 * cap, again when the cap said it would have room or when a call of this instance ends.
 */
export class AdmissionQueue {
  readonly #size: number;
  readonly #clock: Clock;
  readonly #timers: Timers;
  readonly #waiters: Waiter[] = [];
  #pumping = false;
  #cancelWake: (() => void) | undefined;
  /** The cap's latest estimate of the wait, for calls refused without asking it. */
  #lastWaitMs = 1000;

  constructor(options: { size: number; clock: Clock; timers: Timers }) {
    this.#size = options.size;
    this.#clock = options.clock;
    this.#timers = options.timers;
  }

  /** Calls waiting now. */
  get length(): number {
    return this.#waiters.length;
  }

  /**
   * Asks `tryAdmit` until it admits or reports a stop, waiting in turn while it says the cap is
   * full. Answers `over_cap` at once when the queue is full, else when `maxWaitMs` runs out
   * before the cap admits it (a call may end and free a place sooner than the cap's estimate).
   */
  async admit(tryAdmit: () => Admission | Promise<Admission>, maxWaitMs: number): Promise<{ admission: Admission; waitedMs: number }> {
    const started = this.#clock.now();
    if (this.#waiters.length === 0) {
      const first = await tryAdmit();
      if (first.kind !== 'over_cap') return { admission: first, waitedMs: 0 };
      this.#lastWaitMs = first.waitMs;
      if (maxWaitMs <= 0 || this.#size === 0) return { admission: first, waitedMs: 0 };
    } else if (this.#waiters.length >= this.#size || maxWaitMs <= 0) {
      return { admission: { kind: 'over_cap', waitMs: this.#lastWaitMs }, waitedMs: 0 };
    }
    const admission = await new Promise<Admission>((finish) => {
      const waiter: Waiter = { tryAdmit, finish, cancelExpiry: () => {}, expired: false };
      waiter.cancelExpiry = this.#timers.after(maxWaitMs, () => this.#expire(waiter));
      this.#waiters.push(waiter);
      this.#scheduleWake(this.#waiters.length === 1 ? this.#lastWaitMs : undefined);
    });
    return { admission, waitedMs: this.#clock.now() - started };
  }

  /** A call of this instance ended: a slot may be free, so the head asks again now. */
  wake(): void {
    if (this.#waiters.length === 0) return;
    this.#cancelWake?.();
    this.#cancelWake = undefined;
    void this.#pump();
  }

  #expire(waiter: Waiter): void {
    waiter.expired = true;
    // The head may be asking the cap right now; the pump settles it with the answer it gets.
    if (this.#pumping && this.#waiters[0] === waiter) return;
    const i = this.#waiters.indexOf(waiter);
    if (i === -1) return;
    this.#waiters.splice(i, 1);
    waiter.finish({ kind: 'over_cap', waitMs: this.#lastWaitMs });
  }

  #scheduleWake(ms: number | undefined): void {
    if (ms === undefined || this.#cancelWake !== undefined) return;
    this.#cancelWake = this.#timers.after(ms, () => {
      this.#cancelWake = undefined;
      void this.#pump();
    });
  }

  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      while (this.#waiters.length > 0) {
        const head = this.#waiters[0]!;
        const admission = await head.tryAdmit();
        if (admission.kind === 'over_cap') {
          this.#lastWaitMs = admission.waitMs;
          if (!head.expired) {
            this.#scheduleWake(admission.waitMs);
            return;
          }
        }
        this.#waiters.shift();
        head.cancelExpiry();
        head.finish(admission);
      }
    } finally {
      this.#pumping = false;
    }
  }
}
