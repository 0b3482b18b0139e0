import type { BatchConfig } from '../config/types.js';
import type { EndpointName } from '../endpoints.js';
import type { Logger } from '../logging/logger.js';
import type { Timers } from '../timers.js';
import type { UpstreamEvents } from './events.js';
import { BatchSplit, type SplitOutcome } from './batch-split.js';
import { FairPool } from './fair-pool.js';
import { NO_PAYER } from './guard/admission-queue.js';
import { floorOf, msLeft, wasCalled, windowLeavesMs, type Attempt, type BatchTicket, type Layer, type SealedBatch, type UpstreamResult } from './upstream.js';

/** The lookups X answers for many items in one call: `/2/users?ids=`, `/2/users/by?usernames=`, `/2/tweets?ids=`. */
const BATCHABLE: ReadonlySet<EndpointName> = new Set(['user', 'user_by_username', 'tweet']);

/**
 * Whether a miss may share a call with others: a batchable lookup on perch's own credentials. A
 * pass-through key is its own credential, and no other key's item may ride on its call.
 */
export function isBatchable(attempt: Attempt): boolean {
  return attempt.clientKey === undefined && BATCHABLE.has(attempt.request.endpoint);
}

export interface BatchOptions {
  readonly upstream: string;
  readonly config: BatchConfig;
  /** How long a miss may wait for a place under the cap (`queue_timeout_ms`): a seat waits no longer over the cap. */
  readonly queueTimeoutMs: number;
  /** How many misses may wait under the cap (`queue_size`): as many may wait for a seat over it. */
  readonly queueSize: number;
  /** The upstream's `price_per_call`, billed once for each item. */
  readonly price?: number;
  readonly timers: Timers;
  readonly events: UpstreamEvents;
  readonly logger: Logger;
}

/**
 * How long an endpoint's misses go alone once the provider was found refusing its batch calls
 * and serving its single lookups (batch-split.ts): long enough that finding it again, a few calls
 * of a search, costs little beside the single lookups; short enough that batching resumes soon
 * after the provider takes batch calls again.
 */
export const FORM_REFUSED_MS = 60_000;

interface Item {
  readonly attempt: Attempt;
  readonly resolve: (result: UpstreamResult) => void;
  /** A bug below (a call never rejects otherwise): the miss fails as it would alone, a 500. */
  readonly reject: (error: unknown) => void;
  /** Its timer: its wait for a seat, or its own deadline once it rides; cancelled when it is answered. */
  cancelTimer: () => void;
  /** It has its answer: a later one (the call it rode in, after its deadline) is dropped. */
  done: boolean;
  /** It went on the wire and was billed: it is not billed again when asked alone after a search. */
  billed: boolean;
}

/** One call down the layers for the misses of one endpoint. */
interface Ticket {
  /** The item whose call it is: its request, deadline, payer and trace go down the layers. */
  readonly lead: Item;
  /** The items it carries, once on the wire (from the start for a split's call). */
  sealed?: readonly Item[];
  /**
   * What the layers below see of it: `sealed` is set when the items are chosen, a plain field
   * rather than a getter, which doubled the layer's own cost per lone miss (bench/batch-cost.mjs).
   */
  readonly batch: { -readonly [K in keyof BatchTicket]: BatchTicket[K] };
  /** It has gone on the wire. */
  wired: boolean;
  /** The cap refuses it for now: it waits in the cap's queue. */
  queued: boolean;
  /** The search it is a call of, for a batch the provider refused whole. */
  readonly split?: BatchSplit<Item>;
}

/** The misses of one endpoint waiting for a seat, and the calls open to them. */
interface Group {
  readonly endpoint: EndpointName;
  readonly pool: FairPool<Item>;
  /** Calls on their way down (breaker, queue, credentials) that have not yet chosen their items. */
  readonly open: Set<Ticket>;
  /** Seats waiting for company (the window, a call's way to the wire), bounded by their deadlines alone. */
  readonly company: Set<Item>;
  flushing: boolean;
  /** The window while one runs: when it ends (`performance.now()` time), and its timer's cancel. */
  window: { readonly end: number; readonly cancel: () => void } | undefined;
  /** The cap's latest estimate of a wait, in whole seconds: a seat whose wait ran out is told it. */
  retryAfterSeconds: number;
  /** The provider refuses this endpoint's batch calls: each miss goes alone until the timer ends it. */
  alone: { readonly cancel: () => void } | undefined;
}

/**
 * Batch lookups: distinct misses of one endpoint that wait for the provider at the same time go
 * as one call. It sits above the breaker, the throttle, the retries, the credentials, the budget
 * and the guard, so each of them sees one call: one place under the cap and the quota, one
 * verdict, one retry.
 *
 * A miss that finds no call open sends one at the end of the current tick (DataLoader's
 * schedule: `process.nextTick` after the promise jobs already queued; after `window_ms` when the
 * operator asked for one), never later: a lone miss costs what it cost before (the bench's
 * lone-miss figure, docs/performance.md). While a call is on its way down (waiting under the cap, above all),
 * later misses take seats in it; the call chooses its items only when it goes on the wire
 * (`BatchTicket.seal`), up to `max_items`, its lead first and the others in fair order across
 * client keys (fair-pool.ts), and more calls open as more misses wait than the open calls seat,
 * each led by the miss fair order would seat last, so that the seats ahead go to those due first.
 *
 * Waiting for company (the window, a call's way down to the wire: its admission's round trip to
 * Redis, above all) is not waiting over the cap: a seat waits for it as long as its deadline
 * allows (less the floor a call needs), and ends, if it must, as the miss deadline's 504. Only once the cap refuses a call
 * the seat waits for (the call waits in the cap's queue, or is refused `over_cap`) does the seat
 * wait over the cap, at most `queue_timeout_ms` from then, and get `over_cap` with `Retry-After`
 * when that runs out, as in the guard's queue; at most `queue_size` then wait beyond the next
 * call's seats, and past that the miss fair order would seat last is refused at once, as in the
 * guard's full queue.
 *
 * The provider answers each item (`UpstreamResult.items`), and each miss gets its own answer. The
 * call has the latest of its riders' deadlines; a rider whose own deadline passes first is
 * answered 504 alone, and the call goes on for the others. A call that failed as a whole (429,
 * 5xx, timeout) fails each of its items as it would have failed alone; one the provider refused
 * as a bad request is searched for the items at fault (batch-split.ts), each call of the search
 * with the latest deadline of its own items, so that the search stops where the deadline does;
 * when the search finds the provider refusing the batch form itself, the misses of the endpoint go
 * alone for `FORM_REFUSED_MS`, those of the search first. A
 * call refused before the wire (a stop, the breaker, the throttle, its wait run out) was its
 * lead's: the lead gets the refusal, and the others wait on for the next call.
 *
 * Each item is billed once, in the per-key metrics, when it first goes on the wire: the call
 * below carries no key's label or budget, so that neither its retries nor a split's calls count
 * an item again.
 */
export function createBatching(options: BatchOptions): Layer {
  const { upstream, config, queueTimeoutMs, queueSize, timers, events, price, logger } = options;
  // Misses waiting for a seat over the cap count as misses waiting under it (`queue_size`),
  // beyond the seats of the next call.
  const bound = queueSize + config.max_items;
  return (next) => {
    const groups = new Map<EndpointName, Group>();

    function groupOf(endpoint: EndpointName): Group {
      let group = groups.get(endpoint);
      if (group === undefined) {
        group = { endpoint, pool: new FairPool<Item>(), open: new Set(), company: new Set(), flushing: false, window: undefined, retryAfterSeconds: 1, alone: undefined };
        groups.set(endpoint, group);
      }
      return group;
    }

    /** How many items a call of `group` carries at most. */
    function itemsOf(group: Group): number {
      return group.alone === undefined ? config.max_items : 1;
    }

    /** More misses wait than the open calls have seats for. */
    function short(group: Group): boolean {
      return group.pool.size > group.open.size * (itemsOf(group) - 1);
    }

    /** Whether the cap refuses a call the seats wait for now. */
    function capRefuses(group: Group): boolean {
      for (const ticket of group.open) if (ticket.queued) return true;
      return false;
    }

    /**
     * Sends the calls the waiting misses need, now or, when a miss finds no call open and the
     * operator asked for one, after the window. `arriving`: the miss that just took a seat.
     */
    function schedule(group: Group, arriving?: Item): void {
      // A miss with less time than the window would leave it (one failing over, above all) ends
      // the window sooner, so that it still leads a call rather than wait out its deadline.
      if (arriving !== undefined && group.window !== undefined && companyEnd(arriving) < group.window.end) openWindow(group, companyEnd(arriving));
      if (group.flushing || !short(group)) return;
      group.flushing = true;
      if (group.open.size === 0 && config.window_ms > 0 && group.alone === undefined) {
        let end = performance.now() + config.window_ms;
        for (const item of group.company) end = Math.min(end, companyEnd(item));
        openWindow(group, end);
      } else {
        // DataLoader's schedule: after the promise jobs already queued, at the end of this tick.
        void Promise.resolve().then(() => process.nextTick(() => flush(group)));
      }
    }

    function openWindow(group: Group, end: number): void {
      group.window?.cancel();
      group.window = {
        end,
        cancel: timers.after(Math.max(0, Math.floor(end - performance.now())), () => {
          group.window = undefined;
          flush(group);
        }),
      };
    }

    function flush(group: Group): void {
      group.flushing = false;
      while (short(group)) {
        // The first call goes first: it takes the next in fair order. A call opened behind
        // others takes the item fair order would seat last, so that the seats of the calls
        // ahead go to those due first (a key with two misses behind another's backlog).
        const lead = group.open.size === 0 ? group.pool.take()! : group.pool.takeLast()!;
        seated(group, lead);
        send(group, lead);
      }
    }

    /**
     * The latest a window may end for `item` to lead a call: what a window leaves a call before its
     * deadline (call-floor.ts), at least a floor before its wait for company runs out (`wait`), so
     * that the window's end comes first even when both timers are late.
     */
    function companyEnd(item: Item): number {
      return item.attempt.deadline - windowLeavesMs(floorOf(item.attempt));
    }

    /** `item` waits for a seat: for company until the cap refuses a call it waits for, then over the cap. */
    function wait(group: Group, item: Item, overCap: boolean): void {
      item.cancelTimer();
      const { attempt } = item;
      const left = msLeft(attempt.deadline) - floorOf(attempt);
      if (overCap) {
        group.company.delete(item);
        item.cancelTimer = timers.after(Math.max(0, Math.min(queueTimeoutMs, left)), () => expire(group, item, 'over_cap'));
      } else {
        group.company.add(item);
        item.cancelTimer = timers.after(Math.max(0, left), () => expire(group, item, 'no_time'));
      }
    }

    /** The cap refused a call of `group`: every seat waiting for company waits over the cap from now. */
    function refusedByCap(group: Group): void {
      for (const item of group.company) wait(group, item, true);
    }

    /** `item` left the pool to ride or lead a call: its wait for a seat is over. */
    function seated(group: Group, item: Item): void {
      item.cancelTimer();
      item.cancelTimer = () => {};
      group.company.delete(item);
    }

    /** Sends a call down the layers: led by `lead`, with the items a split chose (`part`) or those it will seal. */
    function send(group: Group, lead: Item, split?: BatchSplit<Item>, part?: readonly Item[]): void {
      const ticket: Ticket = {
        lead,
        ...(part === undefined ? {} : { sealed: part, split }),
        batch: {
          seal: () => seal(group, ticket),
          sealed: part === undefined ? undefined : sealedOf(part, split!.proven),
          queued: () => {
            if (ticket.sealed !== undefined || ticket.queued) return;
            ticket.queued = true;
            refusedByCap(group);
          },
        },
        wired: false,
        queued: false,
      };
      if (part === undefined) group.open.add(ticket);
      const { attempt } = lead;
      // Each item's key was charged for its own miss above (chain.ts) and is billed in the metrics
      // once, at its first seal: the call carries neither the budget nor the label of any key.
      const payer = attempt.payer === undefined ? undefined : { ...attempt.payer, budget: undefined, label: NO_PAYER.label };
      const started = performance.now();
      next({ ...attempt, ...(payer === undefined ? {} : { payer }), batch: ticket.batch })
        .then((result) => {
          // The exchange is counted with the miss its answer reaches first; one that reaches
          // none (every rider answered alone, a refusal the search goes on from) is counted here.
          if (!settle(group, ticket, result) && wasCalled(result)) events.upstream(upstream, group.endpoint, result, (performance.now() - started) / 1000);
        })
        .catch((error: unknown) => {
          for (const item of ticket.split?.items ?? ticket.sealed ?? [ticket.lead]) fail(item, error);
          schedule(group);
        });
    }

    function seal(group: Group, ticket: Ticket): SealedBatch {
      if (ticket.wired) return ticket.batch.sealed!;
      ticket.wired = true;
      // A split's call carries the items the search chose, each billed when it first rode.
      if (ticket.split !== undefined) return ticket.batch.sealed!;
      group.open.delete(ticket);
      const items = [ticket.lead];
      while (items.length < itemsOf(group)) {
        const rider = group.pool.take();
        if (rider === undefined) break;
        seated(group, rider);
        items.push(rider);
      }
      ticket.sealed = items;
      const sealed = sealedOf(items, false);
      ticket.batch.sealed = sealed;
      for (const item of items) {
        if (item.billed) continue;
        item.billed = true;
        events.called(upstream, labelOf(item), price);
      }
      if (items.length > 1) {
        events.batched(upstream, group.endpoint, items.map(labelOf));
        // Each rider is answered alone when its own deadline passes, while the call, or the
        // search for an item at fault, goes on for the others.
        const alone: UpstreamResult = { ...DEADLINE_PASSED, batched: { size: items.length, lead: false } };
        for (const item of items) item.cancelTimer = timers.after(Math.max(0, msLeft(item.attempt.deadline)), () => answer(item, alone));
      }
      schedule(group);
      return sealed;
    }

    /** Answers the items of `ticket`'s call; whether a waiting miss took its answer as its own (the set counts the exchange). */
    function settle(group: Group, ticket: Ticket, result: UpstreamResult): boolean {
      group.open.delete(ticket);
      const items = ticket.sealed;
      let taken: boolean;
      if (items === undefined) {
        if (result.kind === 'refused' && result.reason === 'over_cap') {
          group.retryAfterSeconds = result.retryAfterSeconds;
          refusedByCap(group);
        }
        taken = !ticket.lead.done;
        answer(ticket.lead, result);
      } else if (items.length === 1) {
        taken = !items[0]!.done;
        answer(items[0]!, result);
        ticket.split?.settled(outcomeOf(result));
      } else if (result.kind === 'bad_request') {
        taken = false;
        ticket.split?.settled('refused');
      } else {
        const { credential, limit } = result;
        // The call is one exchange, counted with the answer of the first item still waiting for it.
        const lead = items.find((item) => !item.done);
        taken = lead !== undefined;
        items.forEach((item, i) => {
          const own = result.items === undefined ? result : { ...result.items[i]!, ...(credential === undefined ? {} : { credential }), ...(limit === undefined ? {} : { limit }) };
          answer(item, { ...own, batched: { size: items.length, lead: item === lead } });
        });
        ticket.split?.settled(result.items === undefined ? 'failed' : 'answered');
      }
      const split = ticket.split ?? (items !== undefined && items.length > 1 && result.kind === 'bad_request' ? new BatchSplit(items) : undefined);
      let part = split?.next();
      // Items whose deadlines passed have their answers: a call for them alone is not made.
      while (part !== undefined && part.every((item) => item.done)) {
        split!.settled('failed');
        part = split!.next();
      }
      if (part !== undefined) send(group, part[0]!, split, part);
      else if (split?.formRefused === true) aloneFor(group, split.unasked);
      schedule(group);
      return taken;
    }

    /**
     * The provider refused the batch and answered its items alone (batch-split.ts): the items the
     * search had not asked wait for a call again, each alone as every miss of the endpoint for
     * `FORM_REFUSED_MS`, as without batching (under the cap, in fair order, at once).
     */
    function aloneFor(group: Group, unasked: readonly Item[]): void {
      if (group.alone === undefined) {
        logger.warn({ upstream, route: group.endpoint, seconds: FORM_REFUSED_MS / 1000 }, 'provider refuses batch calls and answers single lookups: misses go alone for now');
      }
      group.alone?.cancel();
      group.alone = { cancel: timers.after(FORM_REFUSED_MS, () => (group.alone = undefined)) };
      const overCap = capRefuses(group);
      for (const item of unasked) {
        if (item.done) continue;
        group.pool.add(item.attempt.payer ?? NO_PAYER, item);
        wait(group, item, overCap);
      }
    }

    function sealedOf(items: readonly Item[], proven: boolean): SealedBatch {
      return { requests: items.map((i) => i.attempt.request), deadline: Math.max(...items.map((i) => i.attempt.deadline)), proven };
    }

    function answer(item: Item, result: UpstreamResult): void {
      if (item.done) return;
      item.done = true;
      item.cancelTimer();
      item.resolve(result);
    }

    function fail(item: Item, error: unknown): void {
      if (item.done) return;
      item.done = true;
      item.cancelTimer();
      item.reject(error);
    }

    function expire(group: Group, item: Item, reason: 'over_cap' | 'no_time'): void {
      if (!group.pool.remove(item.attempt.payer ?? NO_PAYER, item)) return;
      group.company.delete(item);
      refuse(group, item, reason);
    }

    function refuse(group: Group, item: Item, reason: 'over_cap' | 'no_time'): void {
      events.refused(upstream, group.endpoint, reason);
      answer(item, { kind: 'refused', reason, retryAfterSeconds: reason === 'over_cap' ? group.retryAfterSeconds : 1 });
    }

    return (attempt) => {
      if (!isBatchable(attempt)) return next(attempt);
      const group = groupOf(attempt.request.endpoint);
      return new Promise<UpstreamResult>((resolve, reject) => {
        const item: Item = { attempt, resolve, reject, cancelTimer: () => {}, done: false, billed: false };
        const payer = attempt.payer ?? NO_PAYER;
        const overCap = capRefuses(group);
        if (overCap) {
          const turnedAway = group.pool.addBounded(payer, item, bound);
          if (turnedAway !== undefined) {
            refuse(group, turnedAway, 'over_cap');
            if (turnedAway === item) return;
          }
        } else {
          group.pool.add(payer, item);
        }
        wait(group, item, overCap);
        schedule(group, item);
      });
    };
  };
}

/** A rider's own deadline passed while the call it rides in was still on the wire. */
const DEADLINE_PASSED: UpstreamResult = { kind: 'timeout', reason: 'no answer within the miss deadline: its batch call goes on for riders with later ones', deadline: true };

function labelOf(item: Item): string {
  return (item.attempt.payer ?? NO_PAYER).label;
}

/** How a call of a split went, for the search: only a 400 is a refusal; a single lookup's 400 is its own failure. */
function outcomeOf(result: UpstreamResult): SplitOutcome {
  if (result.kind === 'bad_request' || (result.kind === 'failed' && result.status === 400)) return 'refused';
  return result.kind === 'ok' || result.kind === 'not_found' ? 'answered' : 'failed';
}
