import type { Clock } from '../../clock.js';
import type { Timers } from '../../timers.js';
import type { Payer } from '../upstream.js';
import type { Admission } from './provider-state.js';

/** Calls perch makes for itself, with no client behind them, share one payer. */
export const NO_PAYER: Payer = { id: '', weight: 1, label: '' };

/**
 * What an ask tells the cap about this instance's queue, so that the fleet's fair queue (Redis)
 * knows who waits here: whether the asking call waits if refused, and the payers whose calls
 * wait here whatever its answer (the asking payer too when it has more).
 */
export interface FairAsk {
  readonly waits: boolean;
  readonly waiting: readonly string[];
}

export type TryAdmit = (fair: FairAsk) => Admission | Promise<Admission>;

/**
 * How many waiting payers an ask names, those with the lowest tags: the fleet needs the lowest
 * of each instance to find its own lowest, and an ask stays a bounded script call.
 */
export const NAMED_PAYERS = 16;

/** Idle flows (no call waiting) kept for their finish tags, beyond twice the waiting calls. */
export const IDLE_FLOWS = 64;

interface Waiter {
  readonly payer: Payer;
  readonly seq: number;
  readonly tryAdmit: TryAdmit;
  readonly finish: (admission: Admission) => void;
  cancelExpiry: () => void;
  expired: boolean;
}

/** One payer's waiting calls, FIFO, and where its turn stands in virtual time. */
interface Flow {
  readonly waiters: Waiter[];
  /** The start tag of its first waiting call (set while it has waiting calls). */
  start: number;
  /** The finish tag of its last admitted call: its next start, unless the virtual time passed it. */
  finish: number;
}

/**
 * The bounded queue in front of an upstream's call cap, shared fairly among the keys whose misses
 * wait in it: start-time fair queuing (Goyal et al.) over one FIFO per key. A key that starts
 * waiting gets the start tag `max(virtual time, its last finish)`; each call admitted moves its
 * key's tag on by `1 / weight`; the key with the lowest tag has the next call, and the virtual
 * time becomes that tag. Only admitted calls move tags: a key's calls that time out cost it no
 * share. A key that asks for less than its share finds the virtual time where the busy keys'
 * calls are and goes ahead of their backlog, so it waits about one call of the cap; while two keys
 * both wait, one with three times the weight gets three calls for one. Only the next call asks
 * the cap, again when the cap said it would have room, when a call of this instance ends, or when
 * a key that starts waiting becomes the next, so capacity is never left idle while a call waits
 * (work-conserving).
 *
 * When the queue is full, the arriving call and the last call of the key furthest ahead in
 * virtual time compete: the one further ahead is refused, so a flood from one key fills the queue
 * without shutting others out.
 *
 * In a fleet every ask names the payers waiting here, so the shared cap renews their turns, and
 * an answer that the cap is owed to one of them (`owed`) makes that payer's call the next to ask;
 * while calls wait, the queue asks at least as often as the cap's registrations need renewing
 * (`renewMs`). A payer whose last waiting call leaves without a place (its wait ran out, it was
 * pushed out, the provider stopped) is withdrawn from the shared queue at once (`withdraw`).
 *
 * Per-payer state is bounded: a payer's flow is kept while it has waiting calls, and without any
 * only for its finish tag, at most `2 * waiting calls + IDLE_FLOWS` flows in all after each
 * admission or departure (none idle once no call waits and more than `IDLE_FLOWS` were kept).
 */
export class AdmissionQueue {
  #size: number;
  readonly #clock: Clock;
  readonly #timers: Timers;
  readonly #flows = new Map<string, Flow>();
  #length = 0;
  #virtualTime = 0;
  #seq = 0;
  #pumping = false;
  /** The waiting call whose admission the pump is asking the cap for now. */
  #asking: Waiter | undefined;
  #cancelWake: (() => void) | undefined;
  /** The cap's latest estimate of the wait, for calls refused without asking it, and when it was made. */
  #lastWaitMs = 1000;
  #lastWaitAt = 0;

  readonly #withdraw: (payer: Payer) => void;
  /** How soon the queue must ask again, while calls wait, for the cap's registrations to hold. */
  #renewMs = Infinity;

  constructor(options: { size: number; clock: Clock; timers: Timers; withdraw?: (payer: Payer) => void }) {
    this.#size = options.size;
    this.#clock = options.clock;
    this.#timers = options.timers;
    this.#withdraw = options.withdraw ?? (() => {});
  }

  /** A reload's new `queue_size`: calls already waiting beyond it keep their places. */
  resize(size: number): void {
    this.#size = size;
  }

  /** Calls waiting now. */
  get length(): number {
    return this.#length;
  }

  /** Payers the queue keeps state for: those waiting, and idle ones kept for their finish tags. */
  get payers(): number {
    return this.#flows.size;
  }

  /**
   * Asks `tryAdmit` until it admits or reports a stop, waiting its key's turn while it says the
   * cap is full. Answers `over_cap` at once when the queue is full and this call is the furthest
   * ahead, else when `maxWaitMs` runs out before the cap admits it (a call may end and free a
   * place sooner than the cap's estimate). `waiting` is told when the call starts waiting: from
   * then on the cap refuses it (a batch call's seats wait over the cap too, batch.ts).
   */
  async admit(payer: Payer, tryAdmit: TryAdmit, maxWaitMs: number, waiting?: () => void): Promise<{ admission: Admission; waitedMs: number }> {
    const started = this.#clock.now();
    if (this.#length === 0) {
      const waits = maxWaitMs > 0 && this.#size > 0;
      const first = await tryAdmit({ waits, waiting: [] });
      if (first.kind !== 'over_cap') {
        this.#served(this.#flow(payer), payer);
        return { admission: first, waitedMs: 0 };
      }
      this.#estimate(first);
      if (!waits) return { admission: first, waitedMs: 0 };
    } else if (maxWaitMs <= 0 || (this.#length >= this.#size && !this.#pushOut(payer))) {
      return { admission: { kind: 'over_cap', waitMs: this.#waitLeft() }, waitedMs: 0 };
    }
    const admission = await new Promise<Admission>((finish) => {
      const waiter: Waiter = { payer, seq: this.#seq++, tryAdmit, finish, cancelExpiry: () => {}, expired: false };
      waiter.cancelExpiry = this.#timers.after(maxWaitMs, () => this.#expire(waiter));
      const flow = this.#flow(payer);
      if (flow.waiters.length === 0) flow.start = Math.max(this.#virtualTime, flow.finish);
      flow.waiters.push(waiter);
      this.#length++;
      waiting?.();
      if (this.#length === 1) this.#scheduleWake(Math.min(this.#lastWaitMs, this.#renewMs));
      // A key that goes ahead of the waiting ones asks now, not at the wake-up set for them: in a
      // fleet the ask registers its turn in the shared cap, which another instance asking at the
      // window's end would otherwise take.
      else if (flow.waiters.length === 1 && this.#next() === flow) this.wake();
    });
    return { admission, waitedMs: this.#clock.now() - started };
  }

  /** A call of this instance ended: a slot may be free, so the next call asks again now. */
  wake(): void {
    if (this.#length === 0) return;
    this.#cancelPendingWake();
    void this.#pump();
  }

  #cancelPendingWake(): void {
    this.#cancelWake?.();
    this.#cancelWake = undefined;
  }

  #flow(payer: Payer): Flow {
    let flow = this.#flows.get(payer.id);
    if (flow === undefined) {
      flow = { waiters: [], start: this.#virtualTime, finish: 0 };
      this.#flows.set(payer.id, flow);
    }
    return flow;
  }

  /** A call of `flow` was admitted: the virtual time moves to its tag, and the flow's tag on. */
  #served(flow: Flow, payer: Payer): void {
    const start = flow.waiters.length > 0 ? flow.start : Math.max(this.#virtualTime, flow.finish);
    this.#virtualTime = Math.max(this.#virtualTime, start);
    flow.finish = start + 1 / payer.weight;
    flow.start = flow.finish;
    this.#bound();
  }

  /**
   * Flows with no call waiting whose finish the virtual time has passed are owed nothing. With
   * nobody waiting at all, none is: calls admitted at once, one payer after another, would
   * otherwise keep an entry each for ever (pass-through keys are many). Payers served once each
   * while another waits leave finishes ahead of the virtual time, which stays at the waiting
   * one's tag: if the idle flows still outnumber the bound, they all go, and a payer among them
   * that comes back starts at the virtual time, a call ahead of where its finish said.
   */
  #bound(): void {
    if (this.#flows.size <= 2 * this.#length + IDLE_FLOWS) return;
    for (const [id, flow] of this.#flows) {
      if (flow.waiters.length === 0 && (flow.finish <= this.#virtualTime || this.#length === 0)) this.#flows.delete(id);
    }
    if (this.#flows.size <= 2 * this.#length + IDLE_FLOWS) return;
    for (const [id, flow] of this.#flows) if (flow.waiters.length === 0) this.#flows.delete(id);
  }

  /** The payers an ask names: those waiting here whatever the asking call's answer, lowest tags first. */
  #waitingPayers(asking: Waiter): string[] {
    const waiting: [number, string][] = [];
    for (const [id, flow] of this.#flows) {
      if (flow.waiters.length - (flow.waiters[0] === asking ? 1 : 0) > 0) waiting.push([flow.start, id]);
    }
    return waiting
      .sort((a, b) => a[0] - b[0])
      .slice(0, NAMED_PAYERS)
      .map(([, id]) => id);
  }

  /** The flow whose turn is next: the lowest start tag, the earliest first call among equals. */
  #next(): Flow | undefined {
    let best: Flow | undefined;
    for (const flow of this.#flows.values()) {
      if (flow.waiters.length === 0) continue;
      if (best === undefined || flow.start < best.start || (flow.start === best.start && flow.waiters[0]!.seq < best.waiters[0]!.seq)) best = flow;
    }
    return best;
  }

  /**
   * Full queue: refuses the last call of the flow furthest ahead (the tag its last call would be
   * admitted at) if that is beyond where a call of `payer` would stand, making room.
   */
  #pushOut(payer: Payer): boolean {
    const mine = this.#flows.get(payer.id);
    const myTag = mine === undefined || mine.waiters.length === 0 ? Math.max(this.#virtualTime, mine?.finish ?? 0) : mine.start + mine.waiters.length / payer.weight;
    let worst: Flow | undefined;
    let worstTag = -Infinity;
    for (const flow of this.#flows.values()) {
      const last = flow.waiters.at(-1);
      if (last === undefined || last === this.#asking) continue;
      const tag = flow.start + (flow.waiters.length - 1) / last.payer.weight;
      if (tag > worstTag) [worst, worstTag] = [flow, tag];
    }
    if (worst === undefined || worstTag <= myTag) return false;
    const refused = worst.waiters.at(-1)!;
    this.#remove(refused, false);
    refused.cancelExpiry();
    refused.finish({ kind: 'over_cap', waitMs: this.#waitLeft() });
    return true;
  }

  /** Takes `waiter` out of the queue; its payer is withdrawn when it leaves its last call unadmitted. */
  #remove(waiter: Waiter, admitted: boolean): void {
    const flow = this.#flows.get(waiter.payer.id)!;
    flow.waiters.splice(flow.waiters.indexOf(waiter), 1);
    this.#length--;
    if (flow.waiters.length === 0 && !admitted) this.#withdraw(waiter.payer);
    // The wake was set for the estimate of a call that left: a call that starts waiting later
    // sets its own, which may be much sooner (a reload or a fallback to this instance's own cap
    // shortens waits), and a wake still pending would keep it from being set.
    if (this.#length === 0) this.#cancelPendingWake();
    if (flow.waiters.length === 0 && flow.finish <= this.#virtualTime) this.#flows.delete(waiter.payer.id);
    this.#bound();
  }

  #expire(waiter: Waiter): void {
    waiter.expired = true;
    // The pump may be asking the cap for it right now; the pump settles it with the answer.
    if (waiter === this.#asking) return;
    this.#remove(waiter, false);
    waiter.finish({ kind: 'over_cap', waitMs: this.#waitLeft() });
  }

  #estimate(refusal: Admission & { kind: 'over_cap' }): void {
    this.#lastWaitMs = refusal.waitMs;
    this.#lastWaitAt = this.#clock.now();
    this.#renewMs = refusal.renewMs ?? Infinity;
  }

  /**
   * What is left of the latest estimate: a call refused when its queue time runs out was last
   * estimated up to `queue_timeout_ms` ago, and that wait has been running since.
   */
  #waitLeft(): number {
    return Math.max(0, this.#lastWaitMs - (this.#clock.now() - this.#lastWaitAt));
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
      /** Flows asked for because the cap said it was owed to them, once each per round. */
      const owedAsked = new Set<Flow>();
      let flow = this.#next();
      while (flow !== undefined) {
        const head = flow.waiters[0]!;
        this.#asking = head;
        const admission = await head.tryAdmit({ waits: true, waiting: this.#waitingPayers(head) });
        this.#asking = undefined;
        if (admission.kind === 'over_cap') {
          this.#estimate(admission);
          if (!head.expired) {
            // The fleet owes the cap to a payer waiting here, not at this queue's head: its call
            // asks now, or the place would stay idle until that payer's turn lapsed.
            const owed = admission.owed === undefined ? undefined : this.#flows.get(admission.owed);
            if (owed !== undefined && owed !== flow && owed.waiters.length > 0 && !owedAsked.has(owed)) {
              owedAsked.add(owed);
              flow = owed;
              continue;
            }
            this.#scheduleWake(Math.min(admission.waitMs, this.#renewMs));
            return;
          }
        } else {
          this.#served(flow, head.payer);
        }
        this.#remove(head, admission.kind === 'admitted');
        head.cancelExpiry();
        head.finish(admission);
        flow = this.#next();
      }
    } finally {
      this.#asking = undefined;
      this.#pumping = false;
    }
  }
}
