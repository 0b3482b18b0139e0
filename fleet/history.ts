import { appendFileSync, readFileSync, writeFileSync } from 'node:fs';

/** Times are milliseconds since the run started, on the fleet process's monotonic clock. */

/** The provider limits of the v1 upstream, as one config in effect sets them. */
export interface Caps {
  readonly rate: number;
  readonly maxConcurrent: number;
  readonly quota: { readonly requests: number; readonly perSeconds: number };
  readonly downShare: number;
}

export interface Plan {
  readonly capacity: number;
  readonly refill: number;
  /** provider_calls per day, when the plan has a budget. */
  readonly budget?: number;
}

export interface RunEvent {
  readonly t: 'run';
  readonly seed: number;
  readonly instances: number;
  readonly workers: number;
  readonly perch: string;
  readonly passThrough: boolean;
  readonly batch: boolean;
  readonly caps: Caps;
  readonly xCaps?: Caps;
  readonly plans: Readonly<Record<string, Plan>>;
  /** Client key id -> plan name. */
  readonly keys: Readonly<Record<string, string>>;
  readonly ttl: number;
  readonly staleSeconds: number;
  readonly missDeadlineMs: number;
  readonly graceMs: number;
  /** Paths only the key `budget` asks for, so every call for them is charged to it. */
  readonly budgetPrefix: string;
  /** Pass-through: `auth.verify_ttl_seconds` (absent from older histories: read as 2, the least drawn). */
  readonly verifyTtl?: number;
}

/** A SIGHUP's new caps and TTL, sent to every instance at `at`. */
export interface ConfigEvent {
  readonly t: 'config';
  readonly at: number;
  readonly caps: Caps;
  readonly ttl: number;
  /** The plans and client keys (key id -> plan name) in force from then on, when the reload set them. */
  readonly plans?: Readonly<Record<string, Plan>>;
  readonly keys?: Readonly<Record<string, string>>;
}

export interface RequestEvent {
  readonly t: 'req';
  readonly id: string;
  readonly inst: number;
  /** The process generation of that instance the request went to. */
  readonly gen: number;
  /** Client key id, or `madeup`. */
  readonly key: string;
  readonly path: string;
  readonly sent: number;
  readonly done: number;
  /** 0: no answer (connection error); -1: the client gave up (disconnect). */
  readonly status: number;
  readonly version?: number;
  readonly etag?: string;
  readonly lastModified?: string;
  /** The version of the body whose validator was sent (If-None-Match or If-Modified-Since). */
  readonly validatorVersion?: number;
  readonly validator?: 'inm' | 'ims';
  readonly cache?: string;
  readonly ratelimit?: string;
  readonly error?: string;
}

export interface CallEvent {
  readonly t: 'call';
  readonly id: number;
  readonly upstream: 'v1' | 'x';
  readonly path: string;
  /** The client resource path the call serves (v1: the path itself). */
  readonly resources: readonly string[];
  readonly cred: string;
  readonly start: number;
  readonly end: number;
  readonly status: number;
  /** Per resource, the version of the body answered. */
  readonly versions?: readonly number[];
  readonly retryAfter?: number;
  /** The instance whose process made the call, found by its connection (in /proc, on Linux). */
  readonly inst?: number;
}

export interface PurgeEvent {
  readonly t: 'purge';
  readonly inst: number;
  /** The resource the scope names (`/v1/users/5/tweets` for tweets of user 5), or `*` for all. */
  readonly scope: string;
  readonly sent: number;
  readonly done: number;
  readonly status: number;
}

export interface FaultEvent {
  readonly t: 'fault';
  /** What the nemesis did, or `redis-seen`: an instance's own log says Redis failed it then. */
  readonly kind: string;
  readonly at: number;
  readonly until: number;
  readonly inst?: number;
  readonly detail?: string;
}

export interface ProcEvent {
  readonly t: 'proc';
  readonly inst: number;
  readonly gen: number;
  readonly kind: 'start' | 'exit';
  readonly at: number;
  /** For `exit`: the signal sent to end it (`SIGTERM`, `SIGKILL`) and when. */
  readonly sentSignal?: string;
  readonly signalAt?: number;
  readonly code?: number | null;
  readonly signal?: string | null;
}

export interface StdoutEvent {
  readonly t: 'stdout';
  readonly inst: number;
  readonly gen: number;
  /** Whether the process ended on SIGTERM (or ran to the end), so its log must be whole. */
  readonly clean: boolean;
  readonly badLines: readonly string[];
  readonly accessIds: readonly string[];
}

/**
 * One instance process's counters, scraped from its metrics port(s) at the end of the run, before
 * SIGTERM, once the provider had no call in flight; with `--workers`, summed over the workers.
 */
export interface MetricsEvent {
  readonly t: 'metrics';
  readonly inst: number;
  readonly gen: number;
  readonly at: number;
  /** perch_requests_total by status. */
  readonly requests: Readonly<Record<string, number>>;
  /** Provider exchanges by upstream name: perch_upstream_requests_total, plus perch_upstream_retries_total{decision="retried"}. */
  readonly calls: Readonly<Record<string, number>>;
  /** perch_key_upstream_calls_total by key id, then upstream name. */
  readonly keyCalls: Readonly<Record<string, Readonly<Record<string, number>>>>;
  /** Whether every worker's process started with this process (no worker restarted, so no counter reset). */
  readonly whole: boolean;
}

export type Event = RunEvent | ConfigEvent | RequestEvent | CallEvent | PurgeEvent | FaultEvent | ProcEvent | StdoutEvent | MetricsEvent;

export class HistoryWriter {
  readonly #path: string;
  readonly events: Event[] = [];

  constructor(path: string) {
    this.#path = path;
    writeFileSync(path, '');
  }

  add(event: Event): void {
    this.events.push(event);
    appendFileSync(this.#path, `${JSON.stringify(event)}\n`);
  }
}

export function readHistory(path: string): Event[] {
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => JSON.parse(line) as Event);
}

/** The history's parts, by kind, in time order. */
export interface History {
  readonly run: RunEvent;
  readonly configs: readonly ConfigEvent[];
  readonly requests: readonly RequestEvent[];
  readonly calls: readonly CallEvent[];
  readonly purges: readonly PurgeEvent[];
  readonly faults: readonly FaultEvent[];
  readonly procs: readonly ProcEvent[];
  readonly stdouts: readonly StdoutEvent[];
  readonly metrics?: readonly MetricsEvent[];
}

export function split(events: readonly Event[]): History {
  const run = events.find((e): e is RunEvent => e.t === 'run');
  if (run === undefined) throw new Error('history without a run event');
  const of = <T extends Event>(t: T['t']) => events.filter((e): e is T => e.t === t);
  return {
    run,
    configs: of<ConfigEvent>('config'),
    requests: of<RequestEvent>('req').sort((a, b) => a.sent - b.sent),
    calls: of<CallEvent>('call').sort((a, b) => a.start - b.start),
    purges: of<PurgeEvent>('purge'),
    faults: of<FaultEvent>('fault'),
    procs: of<ProcEvent>('proc'),
    stdouts: of<StdoutEvent>('stdout'),
    metrics: of<MetricsEvent>('metrics'),
  };
}

/** How long a SIGHUP takes to apply everywhere (the primary hands it on to its workers). */
export const RELOAD_SETTLE_MS = 1000;

/** The plans and keys a config event leaves in force (an event without them changed neither). */
function configState(h: History): { at: number; plans: Readonly<Record<string, Plan>>; keys: Readonly<Record<string, string>> }[] {
  const states = [{ at: -Infinity, plans: h.run.plans, keys: h.run.keys }];
  for (const c of [...h.configs].sort((a, b) => a.at - b.at)) {
    const last = states.at(-1)!;
    states.push({ at: c.at, plans: c.plans ?? last.plans, keys: c.keys ?? last.keys });
  }
  return states;
}

/** Client key `key`'s plan in each config state that may have been in force in [from, to] (undefined: not configured). */
export function plansDuring(h: History, key: string, from: number, to: number): (Plan | undefined)[] {
  const states = configState(h);
  const plans: (Plan | undefined)[] = [];
  for (let i = 0; i < states.length; i++) {
    const begins = states[i]!.at;
    const ends = (states[i + 1]?.at ?? Infinity) + RELOAD_SETTLE_MS;
    if (begins <= to && ends >= from) plans.push(states[i]!.plans[states[i]!.keys[key] ?? '']);
  }
  return plans;
}

/** The plan of client key `key` in force at `at` (undefined: the key was not configured then), ignoring reload delay. */
export function planAt(h: History, key: string, at: number): Plan | undefined {
  const state = configState(h).filter((s) => s.at <= at).at(-1)!;
  return state.plans[state.keys[key] ?? ''];
}

/**
 * The plan of client key `key` that may have been in force at some time in [from, to], a reload
 * taking up to RELOAD_SETTLE_MS to apply: the largest capacity and refill of those plans, or with
 * `least` the smallest, whichever is lenient for the check (`rateLimitUpper`: largest;
 * `underPlanNeverRefused`: least). Undefined when the key had no plan at any time then.
 */
export function planDuring(h: History, key: string, from: number, to: number, least = false): Plan | undefined {
  const plans = plansDuring(h, key, from, to).filter((p): p is Plan => p !== undefined);
  if (plans.length === 0) return undefined;
  const pick = (f: (p: Plan) => number) => (least ? Math.min(...plans.map(f)) : Math.max(...plans.map(f)));
  const budget = plans[0]!.budget;
  return { capacity: pick((p) => p.capacity), refill: pick((p) => p.refill), ...(budget === undefined ? {} : { budget }) };
}
