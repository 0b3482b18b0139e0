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
}

/** A SIGHUP's new caps and TTL, sent to every instance at `at`. */
export interface ConfigEvent {
  readonly t: 'config';
  readonly at: number;
  readonly caps: Caps;
  readonly ttl: number;
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

export type Event = RunEvent | ConfigEvent | RequestEvent | CallEvent | PurgeEvent | FaultEvent | ProcEvent | StdoutEvent;

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
  };
}
