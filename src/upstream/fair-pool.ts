import type { Payer } from './upstream.js';

/** Idle flows (nothing waiting) kept for their finish tags, beyond twice the waiting items. */
const IDLE_FLOWS = 64;

interface Flow<T> {
  readonly items: { readonly item: T; readonly seq: number }[];
  readonly weight: number;
  /** The start tag of its first waiting item (while it has items). */
  start: number;
  /** The finish tag of its last item taken. */
  finish: number;
}

/**
 * Items waiting per payer, taken in start-time fair order: the rule of the call cap's admission
 * queue (guard/admission-queue.ts) applied to the seats of one batch call. A payer that starts
 * waiting gets the start tag `max(virtual time, its last finish)`, each item taken moves its tag
 * on by `1 / weight`, and the lowest tag goes next: a crawler's 500 waiting misses and an app's 2
 * share the next batch's seats one for one until the app's are seated, so the app's two ride in
 * the first four seats whatever the crawler queued before them.
 */
export class FairPool<T> {
  readonly #flows = new Map<string, Flow<T>>();
  #virtualTime = 0;
  #size = 0;
  #seq = 0;

  /** Items waiting. */
  get size(): number {
    return this.#size;
  }

  /** Payers the pool keeps state for: those waiting, and idle ones kept for their finish tags. */
  get payers(): number {
    return this.#flows.size;
  }

  add(payer: Payer, item: T): void {
    let flow = this.#flows.get(payer.id);
    if (flow === undefined) {
      flow = { items: [], weight: payer.weight, start: this.#virtualTime, finish: 0 };
      this.#flows.set(payer.id, flow);
    }
    if (flow.items.length === 0) flow.start = Math.max(this.#virtualTime, flow.finish);
    flow.items.push({ item, seq: this.#seq++ });
    this.#size++;
  }

  /**
   * Adds `item` while fewer than `bound` wait; at the bound, the arriving item and the newest of
   * the payer furthest ahead compete, as in the cap's full queue: the one fair order would seat
   * later is turned away and returned (undefined: nothing was).
   */
  addBounded(payer: Payer, item: T, bound: number): T | undefined {
    if (this.#size < bound) {
      this.add(payer, item);
      return undefined;
    }
    const mine = this.#flows.get(payer.id);
    const myTag = mine === undefined || mine.items.length === 0 ? Math.max(this.#virtualTime, mine?.finish ?? 0) : mine.start + mine.items.length / payer.weight;
    if (this.#lastTag() <= myTag) return item;
    const pushed = this.takeLast()!;
    this.add(payer, item);
    return pushed;
  }

  /** The tag of the item fair order would take last; -Infinity when none waits. */
  #lastTag(): number {
    let worst = -Infinity;
    for (const flow of this.#flows.values()) if (flow.items.length > 0) worst = Math.max(worst, flow.start + (flow.items.length - 1) / flow.weight);
    return worst;
  }

  /** Takes `item` out without it counting as its payer's turn (its wait ended); false when it is not here. */
  remove(payer: Payer, item: T): boolean {
    const flow = this.#flows.get(payer.id);
    const at = flow?.items.findIndex((entry) => entry.item === item) ?? -1;
    if (flow === undefined || at < 0) return false;
    flow.items.splice(at, 1);
    this.#size--;
    this.#bound();
    return true;
  }

  /** The next item in fair order, taken out; undefined when none waits. */
  take(): T | undefined {
    let best: Flow<T> | undefined;
    for (const flow of this.#flows.values()) {
      if (flow.items.length === 0) continue;
      if (best === undefined || flow.start < best.start || (flow.start === best.start && flow.items[0]!.seq < best.items[0]!.seq)) best = flow;
    }
    if (best === undefined) return undefined;
    const { item } = best.items.shift()!;
    this.#size--;
    this.#virtualTime = Math.max(this.#virtualTime, best.start);
    best.finish = best.start + 1 / best.weight;
    best.start = best.finish;
    this.#bound();
    return item;
  }

  /**
   * The item fair order would take last (the newest of the payer furthest ahead), taken out
   * without moving any tag: it leaves the seats to those due before it. The batch layer makes it
   * the lead of a call that opens behind the others, whose turn the cap's own fair queue weighs.
   */
  takeLast(): T | undefined {
    let worst: Flow<T> | undefined;
    let worstTag = -Infinity;
    for (const flow of this.#flows.values()) {
      const last = flow.items.at(-1);
      if (last === undefined) continue;
      const tag = flow.start + (flow.items.length - 1) / flow.weight;
      if (tag > worstTag || (tag === worstTag && last.seq > worst!.items.at(-1)!.seq)) [worst, worstTag] = [flow, tag];
    }
    if (worst === undefined) return undefined;
    const { item } = worst.items.pop()!;
    this.#size--;
    this.#bound();
    return item;
  }

  /**
   * Flows with nothing waiting whose finish the virtual time passed are owed nothing; past the
   * bound every idle flow goes, so a churn of payers never grows the pool.
   */
  #bound(): void {
    if (this.#flows.size <= 2 * this.#size + IDLE_FLOWS) return;
    for (const [id, flow] of this.#flows) if (flow.items.length === 0 && flow.finish <= this.#virtualTime) this.#flows.delete(id);
    if (this.#flows.size <= 2 * this.#size + IDLE_FLOWS) return;
    for (const [id, flow] of this.#flows) if (flow.items.length === 0) this.#flows.delete(id);
  }
}
