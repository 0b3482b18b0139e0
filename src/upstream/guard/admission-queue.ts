import type { Clock } from '../../clock.js';
import type { Timers } from '../../timers.js';
import type { Admission } from './provider-state.js';

/** Who a call is for: the client key whose miss makes it, and its plan's `provider_weight`. */
export interface Payer {
  readonly id: string;
  readonly weight: number;
}

/** Calls perch makes for itself, with no client behind them, share one payer. */
export const NO_PAYER: Payer = { id: '', weight: 1 };

interface Waiter {
  readonly payer: Payer;
  /** Start tag: the virtual time at which this call's turn begins. */
  readonly tag: number;
  readonly seq: number;
  readonly tryAdmit: () => Admission | Promise<Admission>;
  readonly finish: (admission: Admission) => void;
  cancelExpiry: () => void;
  expired: boolean;
}

/**
 * The bounded queue in front of an upstream's call cap, shared fairly among the keys whose misses
 * wait in it: start-time fair queuing (Goyal et al.), FIFO within one key. Each waiting call gets
 * a start tag, `max(virtual time, its key's last finish)`, and its key's finish moves on by
 * `1 / weight`; the waiting call with the lowest tag is next, and the virtual time becomes its
 * tag. A key that asks for less than its share finds the virtual time where the busy keys' calls
 * are and goes ahead of their backlog, so it waits about one call of the cap; a key with twice
 * the weight gets twice the calls while both wait. Only the next call asks the cap, again when
 * the cap said it would have room or when a call of this instance ends, so capacity is never
 * left idle while a call waits (work-conserving).
 *
 * When the queue is full, the arriving call and the waiting call with the highest tag compete:
 * the higher tag is refused, so a flood from one key fills the queue without shutting out others.
 */
export class AdmissionQueue {
  readonly #size: number;
  readonly #clock: Clock;
  readonly #timers: Timers;
  readonly #waiters: Waiter[] = [];
  /** Per key: the finish tag of its latest call; dropped when the virtual time passes it. */
  readonly #finish = new Map<string, number>();
  #virtualTime = 0;
  #seq = 0;
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
   * Asks `tryAdmit` until it admits or reports a stop, waiting its turn while it says the cap is
   * full. Answers `over_cap` at once when the queue is full and this call has the highest tag,
   * else when `maxWaitMs` runs out before the cap admits it (a call may end and free a place
   * sooner than the cap's estimate).
   */
  async admit(payer: Payer, tryAdmit: () => Admission | Promise<Admission>, maxWaitMs: number): Promise<{ admission: Admission; waitedMs: number }> {
    const started = this.#clock.now();
    if (this.#waiters.length === 0) {
      const first = await tryAdmit();
      if (first.kind !== 'over_cap') {
        this.#charge(payer, this.#virtualTime);
        return { admission: first, waitedMs: 0 };
      }
      this.#lastWaitMs = first.waitMs;
      if (maxWaitMs <= 0 || this.#size === 0) return { admission: first, waitedMs: 0 };
    } else if (maxWaitMs <= 0) {
      return { admission: { kind: 'over_cap', waitMs: this.#lastWaitMs }, waitedMs: 0 };
    }
    const tag = Math.max(this.#virtualTime, this.#finish.get(payer.id) ?? 0);
    if (this.#waiters.length >= this.#size && !this.#pushOut(tag)) {
      return { admission: { kind: 'over_cap', waitMs: this.#lastWaitMs }, waitedMs: 0 };
    }
    this.#finish.set(payer.id, tag + 1 / payer.weight);
    const admission = await new Promise<Admission>((finish) => {
      const waiter: Waiter = { payer, tag, seq: this.#seq++, tryAdmit, finish, cancelExpiry: () => {}, expired: false };
      waiter.cancelExpiry = this.#timers.after(maxWaitMs, () => this.#expire(waiter));
      this.#waiters.push(waiter);
      this.#scheduleWake(this.#waiters.length === 1 ? this.#lastWaitMs : undefined);
    });
    return { admission, waitedMs: this.#clock.now() - started };
  }

  /** A call of this instance ended: a slot may be free, so the next call asks again now. */
  wake(): void {
    if (this.#waiters.length === 0) return;
    this.#cancelWake?.();
    this.#cancelWake = undefined;
    void this.#pump();
  }

  /** A call admitted without waiting still counts as its key's service. */
  #charge(payer: Payer, tag: number): void {
    const start = Math.max(tag, this.#finish.get(payer.id) ?? 0);
    this.#finish.set(payer.id, start + 1 / payer.weight);
  }

  /** The waiting call to serve next: the lowest start tag, the earliest arrival among equals. */
  #next(): Waiter | undefined {
    let best: Waiter | undefined;
    for (const w of this.#waiters) if (best === undefined || w.tag < best.tag || (w.tag === best.tag && w.seq < best.seq)) best = w;
    return best;
  }

  /** Full queue: refuses the waiting call with the highest tag if it is above `tag`, making room. */
  #pushOut(tag: number): boolean {
    let worst: Waiter | undefined;
    for (const w of this.#waiters) if (worst === undefined || w.tag > worst.tag || (w.tag === worst.tag && w.seq > worst.seq)) worst = w;
    if (worst === undefined || worst.tag <= tag || (this.#pumping && worst === this.#next())) return false;
    this.#remove(worst);
    worst.cancelExpiry();
    worst.finish({ kind: 'over_cap', waitMs: this.#lastWaitMs });
    return true;
  }

  #remove(waiter: Waiter): void {
    this.#waiters.splice(this.#waiters.indexOf(waiter), 1);
    // Its key's finish was moved on for it: take that back, so a refused call costs no share.
    if (this.#finish.get(waiter.payer.id) === waiter.tag + 1 / waiter.payer.weight) this.#finish.set(waiter.payer.id, waiter.tag);
  }

  #expire(waiter: Waiter): void {
    waiter.expired = true;
    // The next call may be asking the cap right now; the pump settles it with the answer it gets.
    if (this.#pumping && this.#next() === waiter) return;
    if (!this.#waiters.includes(waiter)) return;
    this.#remove(waiter);
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
      for (let head = this.#next(); head !== undefined; head = this.#next()) {
        const admission = await head.tryAdmit();
        if (admission.kind === 'over_cap') {
          this.#lastWaitMs = admission.waitMs;
          if (!head.expired) {
            this.#scheduleWake(admission.waitMs);
            return;
          }
          this.#remove(head);
        } else {
          this.#waiters.splice(this.#waiters.indexOf(head), 1);
          this.#virtualTime = Math.max(this.#virtualTime, head.tag);
          this.#forgetIdle();
        }
        head.cancelExpiry();
        head.finish(admission);
      }
    } finally {
      this.#pumping = false;
    }
  }

  /** Keys whose last finish the virtual time has passed are owed nothing: their entry can go. */
  #forgetIdle(): void {
    if (this.#finish.size <= 2 * this.#waiters.length + 64) return;
    for (const [id, finish] of this.#finish) if (finish <= this.#virtualTime) this.#finish.delete(id);
  }
}
