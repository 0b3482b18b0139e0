import { hash } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';
import type { AuthConfig } from '../config/types.js';
import type { EndpointName } from '../endpoints.js';
import { by, GONE, LATE } from '../timers.js';
import type { UpstreamAnswer } from '../upstream/answer.js';
import type { UpstreamResult } from '../upstream/upstream.js';
import { addressSource } from './client-address.js';
import type { Client } from './key-store.js';
import { KEY_FIELD, type FleetTurn, type SharedVerdict, type SharedVerdicts } from './shared-verdicts.js';

/**
 * A client of pass-through auth (`auth.mode: upstream`). The key itself travels with its request
 * only, because it is the credential of that request's upstream call; verdicts are kept under
 * its digest. `id` (`client:` and 16 hex digits of the digest) names the key in logs, rate
 * limits and provider stops.
 */
export interface PassThroughClient extends Client {
  readonly key: string;
  /** Lowercase hex SHA-256 of the key. */
  readonly digest: string;
  /** The source the request came from (client-address.ts): unknown keys' verifying calls are bounded per source. */
  readonly source: string;
}

/**
 * The `key_id` metrics label of every pass-through client: forwarded keys are unbounded, and a
 * label per key would let any caller grow the metrics without end.
 */
export const PASS_THROUGH_METRICS_ID = 'upstream-auth';

/** The pass-through client behind `client`, or undefined for a key of `auth.keys`. */
export function passThrough(client: Client | undefined): PassThroughClient | undefined {
  return client !== undefined && 'digest' in client ? (client as PassThroughClient) : undefined;
}

/**
 * Where a key stands on one endpoint, by what the provider said:
 * - `accepted`: it answered the key there (a body, or its own not found) within
 *   `verify_ttl_seconds`: the cache answers the key;
 * - `stale`: it did so within twice that: the cache still answers the key while one revalidation
 *   of the key runs (stale-while-revalidate, for acceptance);
 * - `refused`: it rejected the key (401, for `v1` a 403) or refused it this endpoint (X's 403)
 *   within `reject_ttl_seconds`: 401 without a call;
 * - `known`: none of the above, but it accepted the key on another endpoint lately: its verifying
 *   call here draws on the accepted keys' budget;
 * - `unknown`: it accepted the key nowhere lately: a verifying call, in the unknown keys' line.
 */
export type Standing = 'accepted' | 'stale' | 'refused' | 'known' | 'unknown';

/** Which budget a verifying call draws on: keys the provider accepted somewhere, or the others. */
export type VerifyLine = 'known' | 'unknown';

/**
 * How a request of a key not accepted on its endpoint goes on, once the key's verifying call
 * under way (of this instance, or of another on the same Redis) has given its verdict:
 * `admitted`, the cache answers it; `refused`, 401; `failed`, that call failed without a verdict
 * (the provider down, a wait, no turn) and its answer is this request's too; `late` and `left`,
 * the request stopped waiting (`gate`); `verify`, this
 * request's own call is the key's verifying call, and `done` must follow it.
 */
export type Gate =
  | { readonly kind: 'admitted' }
  | { readonly kind: 'refused' }
  | { readonly kind: 'failed'; readonly answer: UpstreamAnswer }
  /** The request's miss deadline passed while it waited: no call is made for it. */
  | { readonly kind: 'late' }
  /** The request's client left while it waited: nobody is answered, no call is made. */
  | { readonly kind: 'left' }
  | { readonly kind: 'verify'; readonly line: VerifyLine; done(failure?: UpstreamAnswer): void };

/** What the provider said about a key on one endpoint, and when (epoch ms). */
interface Said {
  readonly accepted: boolean;
  readonly at: number;
}

/** A key's verifying call in this instance: the key's other requests wait for it. */
class Flight {
  readonly settled: Promise<UpstreamAnswer | undefined>;
  settle!: (failure: UpstreamAnswer | undefined) => void;

  constructor() {
    this.settled = new Promise((resolve) => (this.settle = resolve));
  }
}

/**
 * The verdicts of one instance, and its keys' verifying calls under way. A reload keeps it as
 * long as the mode and the providers (each upstream's kind and url) stay the same: what the
 * provider said of a key is still true after a change of plans, budgets or TTLs. The verifier of
 * the configuration a reload replaced still writes here the verdicts of its calls under way, and
 * the requests waiting for them read them here through the new one.
 */
export class VerdictBook {
  /** Names the providers whose verdicts these are (runtime.ts). */
  readonly providers: string;
  /**
   * Key digest -> what the provider said of it per endpoint, since its last rejection. Apart from
   * rejections, each side at most `remembered_keys` (least recently used dropped first): a flood
   * of made-up keys fills the rejected side only and never pushes out a key the provider accepted.
   */
  said: LRUCache<string, Map<EndpointName, Said>>;
  /** Key digest -> when the provider rejected the key itself (401). */
  rejected: LRUCache<string, number>;
  readonly flights = new Map<string, Flight>();
  /** Per key, the latest verdict on its way to the fleet: the key's turn is released after it. */
  readonly told = new Map<string, Promise<void>>();

  constructor(rememberedKeys: number, providers: string) {
    this.providers = providers;
    this.said = new LRUCache({ max: rememberedKeys });
    this.rejected = new LRUCache({ max: rememberedKeys });
  }

  /** Bounds each side at `rememberedKeys` from now on, keeping what it can of what it holds. */
  remember(rememberedKeys: number): void {
    if (this.said.max === rememberedKeys) return;
    this.said = resized(this.said, rememberedKeys);
    this.rejected = resized(this.rejected, rememberedKeys);
  }
}

/** A copy of `cache` bounded at `max`: least recently used first, so that the order of use survives, and a smaller bound drops the oldest. */
function resized<V extends {}>(cache: LRUCache<string, V>, max: number): LRUCache<string, V> {
  const copy = new LRUCache<string, V>({ max });
  for (const digest of cache.rkeys()) copy.set(digest, cache.peek(digest)!);
  return copy;
}

/** A read of the fleet's word on a key, and the read the key's later requests wait for. */
interface FleetRead {
  readonly sent: Promise<void>;
  next?: Promise<void>;
}

/** The fleet's share of verification: verdicts and turns in Redis, under the book's providers. */
export interface FleetVerdicts {
  readonly store: SharedVerdicts;
  /** How long a verifying call may hold the key's turn: the miss deadline and a margin. */
  readonly turnMs: number;
}

/**
 * What the provider said about each forwarded key, per endpoint (see `Standing`), and the one
 * verifying call per key at a time: within this instance, and with `fleet` across every instance
 * on its Redis, where verdicts are shared. Only a provider's answer to a call made with the key
 * counts; an answer perch makes itself never does.
 */
export class UpstreamVerifier {
  readonly #book: VerdictBook;
  readonly #fleet: FleetVerdicts | undefined;
  readonly #plan: string;
  readonly #verifyMs: number;
  readonly #rejectMs: number;
  readonly #clock: Clock;
  /** Per key, the read of the fleet's word under way (`reconcile`), and the one queued behind it. */
  readonly #reading = new Map<string, FleetRead>();

  constructor(auth: AuthConfig, clock: Clock, book: VerdictBook, fleet?: FleetVerdicts) {
    this.#book = book;
    this.#fleet = fleet;
    // Validation guarantees a default plan in mode upstream.
    this.#plan = auth.default_plan!;
    this.#verifyMs = auth.verify_ttl_seconds * 1000;
    this.#rejectMs = auth.reject_ttl_seconds * 1000;
    this.#clock = clock;
  }

  /**
   * The client for a presented key; undefined for a missing, empty, repeated or rejected key.
   * `remoteAddress`: the request's peer, whose source bounds the key's verifying calls.
   */
  authenticate(presented: string | string[] | undefined, remoteAddress: string | undefined): PassThroughClient | undefined {
    if (typeof presented !== 'string' || presented === '') return undefined;
    const digest = hash('sha256', presented, 'hex');
    if (this.#rejectedNow(digest)) return undefined;
    return { id: `client:${digest.slice(0, 16)}`, plan: this.#plan, metricsId: PASS_THROUGH_METRICS_ID, key: presented, digest, source: addressSource(remoteAddress) };
  }

  /**
   * With Redis, for a key this instance holds accepted on some endpoint, which its cache would
   * answer without asking anyone: reads what the fleet heard of the key first, so that a 401 (or
   * a 403 on an endpoint) another instance heard ends the key here too. Resolves to the client,
   * or to undefined when the key stands rejected now. Undefined, at once, when there is nothing to
   * read: no Redis, or a key not accepted here (its verification reads the fleet's word anyway).
   * A read is sent after the request arrived, never one already on its way, which may have left
   * before the verdict reached Redis; the requests of a key that arrive meanwhile share the next.
   */
  reconcile(client: PassThroughClient): Promise<PassThroughClient | undefined> | undefined {
    if (this.#fleet === undefined || !this.accepted(client)) return undefined;
    const { digest } = client;
    const reading = this.#reading.get(digest);
    let read: Promise<void>;
    if (reading === undefined) read = this.#read(digest);
    else read = reading.next ??= reading.sent.then(() => this.#read(digest));
    return read.then(() => (this.#rejectedNow(digest) ? undefined : client));
  }

  /** Sends one read of the fleet's word on the key; the next is queued behind it (`reconcile`). */
  #read(digest: string): Promise<void> {
    const reading: FleetRead = {
      sent: this.#hear(digest).finally(() => {
        if (this.#reading.get(digest) === reading) this.#reading.delete(digest);
      }),
    };
    this.#reading.set(digest, reading);
    return reading.sent;
  }

  /** Where the key stands on `endpoint` now, by this instance's memory. */
  standing(client: PassThroughClient, endpoint: EndpointName): Standing {
    if (this.#rejectedNow(client.digest)) return 'refused';
    const said = this.#book.said.get(client.digest);
    const here = said?.get(endpoint);
    const now = this.#clock.now();
    if (here !== undefined) {
      const age = now - here.at;
      if (!here.accepted && age < this.#rejectMs) return 'refused';
      if (here.accepted && age < this.#verifyMs) return 'accepted';
      if (here.accepted && age < 2 * this.#verifyMs) return 'stale';
    }
    return said !== undefined && this.#acceptedSomewhere(said, now) ? 'known' : 'unknown';
  }

  /** Whether the provider accepted the key on some endpoint lately (fresh or stale): a caller's trace context counts then. */
  accepted(client: PassThroughClient): boolean {
    if (this.#rejectedNow(client.digest)) return false;
    const said = this.#book.said.get(client.digest);
    return said !== undefined && this.#acceptedSomewhere(said, this.#clock.now());
  }

  /**
   * Records what the answer to a call made with this key on `endpoint` says about the key. Only
   * an answer the provider sent for it counts: a 2xx or a not found accepts the key there, a
   * rejected credential (401, or 403 for `v1`) rejects it everywhere, X's 403 refuses it on that
   * endpoint only. Everything else says nothing: errors, 429s, perch's refusals, and a not found
   * perch made itself for a request the provider cannot match (`unasked`), which a made-up key
   * could otherwise ask for to be accepted without the provider ever seeing it.
   * Returns, for a rejection or a refusal, the write that tells the fleet: the request that heard
   * it is answered once Redis has it, so no instance serves the key after its client saw the 401.
   */
  judge(client: PassThroughClient, endpoint: EndpointName, result: UpstreamResult): Promise<void> | undefined {
    const at = this.#clock.now();
    const { digest } = client;
    if (result.kind === 'ok' || (result.kind === 'not_found' && result.unasked !== true)) {
      this.#book.rejected.delete(digest);
      this.#say(digest, endpoint, { accepted: true, at });
      // Every renewal too: the fleet's record must date the acceptance as this instance does, or
      // another instance would send the key to the unknown keys' line while it still holds.
      this.#tell(digest, endpoint, { kind: 'a', at });
      return undefined;
    }
    if (result.kind === 'failed' && result.failure === 'unauthorized') return this.#reject(digest, at);
    if (result.kind === 'failed' && result.failure === 'forbidden') {
      this.#say(digest, endpoint, { accepted: false, at });
      return this.#tell(digest, endpoint, { kind: 'f', at });
    }
    return undefined;
  }

  /**
   * Records the answer to a call that asked who the key speaks for (`whoAmI`): a key that speaks
   * for a user (`ok`) is rejected as a key the provider rejected is, and so is one it rejected.
   * Any other answer says nothing: the key's verifying call decides. Returns the write of a
   * rejection to the fleet, as `judge` does.
   */
  judgeWhoAmI(client: PassThroughClient, result: UpstreamResult): Promise<void> | undefined {
    if (result.kind === 'ok' || (result.kind === 'failed' && result.failure === 'unauthorized')) return this.#reject(client.digest, this.#clock.now());
    return undefined;
  }

  /**
   * For a request of a key not accepted on `endpoint`: waits while the key's verifying call runs
   * (here, or with Redis on another instance, whose verdict is then read), and says how the
   * request goes on (`Gate`). One verifying call per key at a time, whatever endpoints its
   * requests ask for: a flood of one key costs one call per verdict.
   * `deadline` (on `performance.now()`): the request's miss deadline, past which it waits no more
   * (`late`), however long another instance holds the key's turn or Redis takes to answer.
   * `left`: aborted once the request's client is gone, which ends its wait (`left`) too.
   */
  async gate(client: PassThroughClient, endpoint: EndpointName, deadline = Infinity, left?: AbortSignal): Promise<Gate> {
    const { digest } = client;
    for (;;) {
      const before = decided(this.standing(client, endpoint));
      if (before !== undefined) return before;
      const running = this.#book.flights.get(digest);
      if (running !== undefined) {
        const failure = await by(running.settled, deadline, left);
        if (failure === LATE || failure === GONE) return stopped(failure);
        const after = decided(this.standing(client, endpoint));
        if (after !== undefined) return after;
        if (failure !== undefined) return { kind: 'failed', answer: failure };
        continue;
      }
      const flight = new Flight();
      this.#book.flights.set(digest, flight);
      const taking = this.#take(digest);
      const turn = await by(taking, deadline, left);
      if (turn === LATE || turn === GONE) {
        // Redis may grant the turn after this request stopped waiting: it is given back at once.
        void taking.then((late) => typeof late === 'object' && late.release());
        this.#land(digest, flight, undefined, undefined);
        return stopped(turn);
      }
      if (turn === 'held') {
        const { store, turnMs } = this.#fleet!;
        const heard = await by(
          store.ended(this.#book.providers, digest, Math.min(turnMs, deadline - performance.now())).then(() => this.#hear(digest)),
          deadline,
          left,
        );
        this.#land(digest, flight, undefined, undefined);
        if (heard === LATE || heard === GONE) return stopped(heard);
        continue;
      }
      // The turn may be ours just after another instance gave its verdict.
      const heard = await by(this.#hear(digest), deadline, left);
      if (heard === LATE || heard === GONE) {
        this.#land(digest, flight, turn, undefined);
        return stopped(heard);
      }
      const standing = this.standing(client, endpoint);
      const now = decided(standing);
      if (now !== undefined) {
        this.#land(digest, flight, turn, undefined);
        return now;
      }
      return { kind: 'verify', line: standing === 'known' ? 'known' : 'unknown', done: (failure) => this.#land(digest, flight, turn, failure) };
    }
  }

  /**
   * For a request of a key whose acceptance on `endpoint` is stale, answered from the cache
   * meanwhile: runs `call`, the key's revalidation, unless a verifying call of the key is under
   * way (here or elsewhere in the fleet) or the fleet heard of a fresh acceptance meanwhile.
   * `call` takes its turn and makes the call; it must not reject.
   */
  async revalidate(client: PassThroughClient, endpoint: EndpointName, call: () => Promise<void>): Promise<void> {
    const { digest } = client;
    if (this.#book.flights.has(digest)) return;
    const flight = new Flight();
    this.#book.flights.set(digest, flight);
    const turn = await this.#take(digest);
    if (turn === 'held') return this.#land(digest, flight, undefined, undefined);
    try {
      await this.#hear(digest);
      if (this.standing(client, endpoint) === 'stale') await call();
    } finally {
      this.#land(digest, flight, turn, undefined);
    }
  }

  /** Verdicts held now, of each kind: each at most `remembered_keys`, however many keys callers make up. */
  held(): { readonly accepted: number; readonly rejected: number } {
    return { accepted: this.#book.said.size, rejected: this.#book.rejected.size };
  }

  #acceptedSomewhere(said: ReadonlyMap<EndpointName, Said>, now: number): boolean {
    for (const verdict of said.values()) if (verdict.accepted && now - verdict.at < 2 * this.#verifyMs) return true;
    return false;
  }

  /** Whether the key's rejection holds now; one that ran out is dropped. */
  #rejectedNow(digest: string): boolean {
    const at = this.#book.rejected.get(digest);
    if (at === undefined) return false;
    if (this.#clock.now() - at < this.#rejectMs) return true;
    this.#book.rejected.delete(digest);
    return false;
  }

  #reject(digest: string, at: number): Promise<void> | undefined {
    this.#book.said.delete(digest);
    this.#book.rejected.set(digest, at);
    return this.#tell(digest, KEY_FIELD, { kind: 'r', at });
  }

  #say(digest: string, endpoint: EndpointName, verdict: Said): void {
    const said = this.#book.said.get(digest) ?? new Map<EndpointName, Said>();
    said.set(endpoint, verdict);
    this.#book.said.set(digest, said);
  }

  /** Tells the fleet a verdict; the key's turn is released only once Redis has it (`#land`). Undefined without Redis. */
  #tell(digest: string, field: string, verdict: SharedVerdict): Promise<void> | undefined {
    if (this.#fleet === undefined) return undefined;
    const told = this.#fleet.store.record(this.#book.providers, digest, field, verdict, verdict.kind === 'a' ? 2 * this.#verifyMs : this.#rejectMs);
    this.#book.told.set(digest, told);
    void told.then(() => {
      if (this.#book.told.get(digest) === told) this.#book.told.delete(digest);
    });
    return told;
  }

  /** What the fleet heard about the key, merged into this instance's memory: the newer word wins. */
  async #hear(digest: string): Promise<void> {
    if (this.#fleet === undefined) return;
    const heard = await this.#fleet.store.read(this.#book.providers, digest);
    if (heard === undefined) return;
    const rejection = heard.get(KEY_FIELD);
    const rejectedAt = Math.max(this.#book.rejected.get(digest) ?? -Infinity, rejection?.at ?? -Infinity);
    const said = new Map(this.#book.said.get(digest));
    for (const [field, verdict] of heard) {
      if (field === KEY_FIELD) continue;
      const endpoint = field as EndpointName;
      const mine = said.get(endpoint);
      if (mine === undefined || mine.at < verdict.at) said.set(endpoint, { accepted: verdict.kind === 'a', at: verdict.at });
    }
    // What the provider said before the key's rejection is void; an acceptance since ends it.
    for (const [endpoint, verdict] of said) if (verdict.at <= rejectedAt) said.delete(endpoint);
    const acceptedSince = [...said.values()].some((verdict) => verdict.accepted);
    if (said.size > 0) this.#book.said.set(digest, said);
    else this.#book.said.delete(digest);
    if (Number.isFinite(rejectedAt) && !acceptedSince) this.#book.rejected.set(digest, rejectedAt);
    else this.#book.rejected.delete(digest);
  }

  /** The key's turn across the fleet; undefined without Redis (or when it did not answer), where this instance's flight is the only one. */
  async #take(digest: string): Promise<FleetTurn | 'held' | undefined> {
    if (this.#fleet === undefined) return undefined;
    return this.#fleet.store.take(this.#book.providers, digest, this.#fleet.turnMs);
  }

  /** Ends the key's flight: its waiters look again, and the fleet's turn is released once the verdict is in Redis. */
  #land(digest: string, flight: Flight, turn: FleetTurn | undefined, failure: UpstreamAnswer | undefined): void {
    if (this.#book.flights.get(digest) === flight) this.#book.flights.delete(digest);
    flight.settle(failure);
    if (turn === undefined) return;
    const told = this.#book.told.get(digest);
    if (told === undefined) turn.release();
    else void told.then(() => turn.release());
  }
}

/** The gate of a standing that needs no call: admitted or refused; undefined when the key must be verified. */
function decided(standing: Standing): Gate | undefined {
  if (standing === 'accepted' || standing === 'stale') return ADMITTED;
  return standing === 'refused' ? REFUSED : undefined;
}

/** The gate of a wait `by` cut short. */
function stopped(cut: typeof LATE | typeof GONE): Gate {
  return cut === LATE ? LATE_GATE : LEFT_GATE;
}

const ADMITTED: Gate = { kind: 'admitted' };
const LATE_GATE: Gate = { kind: 'late' };
const LEFT_GATE: Gate = { kind: 'left' };
const REFUSED: Gate = { kind: 'refused' };
