import type { BatchConfig } from '../config/types.js';
import type { EndpointName } from '../endpoints.js';
import type { Timers } from '../timers.js';
import type { UpstreamEvents } from './events.js';
import { FairPool } from './fair-pool.js';
import { NO_PAYER } from './guard/admission-queue.js';
import { floorOf, msLeft, type Attempt, type Layer, type SealedBatch, type UpstreamResult } from './upstream.js';

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
  /** How long a miss may wait for a place under the cap (`queue_timeout_ms`): a seat waits no longer. */
  readonly queueTimeoutMs: number;
  /** How many misses may wait under the cap (`queue_size`): as many may wait for a seat. */
  readonly queueSize: number;
  /** The upstream's `price_per_call`, for the items that ride in another's call. */
  readonly price?: number;
  readonly timers: Timers;
  readonly events: UpstreamEvents;
}

interface Item {
  readonly attempt: Attempt;
  readonly resolve: (result: UpstreamResult) => void;
  /** A bug below (a call never rejects otherwise): the miss fails as it would alone, a 500. */
  readonly reject: (error: unknown) => void;
  cancelExpiry: () => void;
}

/** One call down the layers for the misses of one endpoint. */
interface Ticket {
  /** The item whose call it is: its request, deadline, payer and trace go down the layers. */
  readonly lead: Item;
  /** Items chosen before the call: a half of a batch the provider refused whole. */
  readonly fixed?: readonly Item[];
  /** The items it carries, once on the wire. */
  sealed?: readonly Item[];
  sealedBatch?: SealedBatch;
}

/** The misses of one endpoint waiting for a seat, and the calls open to them. */
interface Group {
  readonly endpoint: EndpointName;
  readonly pool: FairPool<Item>;
  /** Calls on their way down (breaker, queue, credentials) that have not yet chosen their items. */
  readonly open: Set<Ticket>;
  flushing: boolean;
  /** The cap's latest estimate of a wait, in whole seconds: a seat whose wait ran out is told it. */
  retryAfterSeconds: number;
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
 * The provider answers each item (`UpstreamResult.items`), and each miss gets its own answer. A
 * call that failed as a whole (429, 5xx, timeout) fails each of its items as it would have failed
 * alone; one the provider refused as a bad request is split in halves, each a call of its own,
 * until the item at fault is alone and gets the single lookup's answer. A call refused before the
 * wire (a stop, the breaker, the throttle, its wait run out) was its lead's: the lead gets the
 * refusal, and the others wait on for the next call. A seat waits at most `queue_timeout_ms`, or
 * what its deadline leaves, like a miss in the guard's queue, and then gets `over_cap`; at most
 * `queue_size` wait beyond the next call's seats, and past that the miss fair order would seat
 * last is refused at once, as in the guard's full queue.
 */
export function createBatching(options: BatchOptions): Layer {
  const { upstream, config, queueTimeoutMs, queueSize, timers, events, price } = options;
  const seats = config.max_items - 1;
  // Misses waiting for a seat count as misses waiting under the cap (`queue_size`), beyond the
  // seats of the next call, which a lone miss passes through for a tick even with no queue.
  const bound = queueSize + config.max_items;
  return (next) => {
    const groups = new Map<EndpointName, Group>();

    function groupOf(endpoint: EndpointName): Group {
      let group = groups.get(endpoint);
      if (group === undefined) {
        group = { endpoint, pool: new FairPool<Item>(), open: new Set(), flushing: false, retryAfterSeconds: 1 };
        groups.set(endpoint, group);
      }
      return group;
    }

    /** More misses wait than the open calls have seats for. */
    function short(group: Group): boolean {
      return group.pool.size > group.open.size * seats;
    }

    function schedule(group: Group): void {
      if (group.flushing || !short(group)) return;
      group.flushing = true;
      const flush = () => {
        group.flushing = false;
        while (short(group)) {
          // The first call goes first: it takes the next in fair order. A call opened behind
          // others takes the item fair order would seat last, so that the seats of the calls
          // ahead go to those due first (a key with two misses behind another's backlog).
          const lead = group.open.size === 0 ? group.pool.take()! : group.pool.takeLast()!;
          lead.cancelExpiry();
          send(group, { lead });
        }
      };
      if (group.open.size === 0 && config.window_ms > 0) timers.after(config.window_ms, flush);
      // DataLoader's schedule: after the promise jobs already queued, at the end of this tick.
      else void Promise.resolve().then(() => process.nextTick(flush));
    }

    function send(group: Group, ticket: Ticket): void {
      if (ticket.fixed === undefined) group.open.add(ticket);
      const { attempt } = ticket.lead;
      // Each item's key was charged for its own miss above (chain.ts): the call charges no key.
      const payer = attempt.payer?.budget === undefined ? attempt.payer : { ...attempt.payer, budget: undefined };
      const down: Attempt = { ...attempt, ...(payer === undefined ? {} : { payer }), batch: { seal: () => seal(group, ticket) } };
      next(down)
        .then((result) => settle(group, ticket, result))
        .catch((error: unknown) => {
          for (const item of ticket.sealed ?? ticket.fixed ?? [ticket.lead]) item.reject(error);
          schedule(group);
        });
    }

    function seal(group: Group, ticket: Ticket): SealedBatch {
      if (ticket.sealedBatch !== undefined) return ticket.sealedBatch;
      group.open.delete(ticket);
      const items = ticket.fixed === undefined ? [ticket.lead] : [...ticket.fixed];
      while (ticket.fixed === undefined && items.length < config.max_items) {
        const rider = group.pool.take();
        if (rider === undefined) break;
        rider.cancelExpiry();
        items.push(rider);
      }
      ticket.sealed = items;
      ticket.sealedBatch = { requests: items.map((i) => i.attempt.request), deadline: Math.min(...items.map((i) => i.attempt.deadline)) };
      if (items.length > 1) events.batched(upstream, group.endpoint, items.map((i) => (i.attempt.payer ?? NO_PAYER).label), price);
      schedule(group);
      return ticket.sealedBatch;
    }

    function settle(group: Group, ticket: Ticket, result: UpstreamResult): void {
      group.open.delete(ticket);
      const items = ticket.sealed;
      if (items === undefined) {
        if (result.kind === 'refused' && result.reason === 'over_cap') group.retryAfterSeconds = result.retryAfterSeconds;
        for (const item of ticket.fixed ?? [ticket.lead]) item.resolve(result);
      } else if (items.length === 1) {
        items[0]!.resolve(result);
      } else if (result.items !== undefined) {
        const { credential, limit } = result;
        items.forEach((item, i) => item.resolve({ ...result.items![i]!, ...(credential === undefined ? {} : { credential }), ...(limit === undefined ? {} : { limit }), batched: { size: items.length, lead: i === 0 } }));
      } else if (result.kind === 'bad_request') {
        const half = Math.ceil(items.length / 2);
        for (const part of [items.slice(0, half), items.slice(half)]) send(group, { lead: part[0]!, fixed: part });
      } else {
        items.forEach((item, i) => item.resolve({ ...result, batched: { size: items.length, lead: i === 0 } }));
      }
      schedule(group);
    }

    function expire(group: Group, item: Item): void {
      if (group.pool.remove(item.attempt.payer ?? NO_PAYER, item)) refuse(group, item);
    }

    function refuse(group: Group, item: Item): void {
      events.refused(upstream, group.endpoint, 'over_cap');
      item.resolve({ kind: 'refused', reason: 'over_cap', retryAfterSeconds: group.retryAfterSeconds });
    }

    return (attempt) => {
      if (!isBatchable(attempt)) return next(attempt);
      const group = groupOf(attempt.request.endpoint);
      return new Promise<UpstreamResult>((resolve, reject) => {
        const item: Item = { attempt, resolve, reject, cancelExpiry: () => {} };
        const turnedAway = group.pool.addBounded(attempt.payer ?? NO_PAYER, item, bound);
        if (turnedAway !== undefined) {
          turnedAway.cancelExpiry();
          refuse(group, turnedAway);
          if (turnedAway === item) return;
        }
        const waitMs = Math.max(0, Math.min(queueTimeoutMs, msLeft(attempt.deadline) - floorOf(attempt)));
        item.cancelExpiry = timers.after(waitMs, () => expire(group, item));
        schedule(group);
      });
    };
  };
}
