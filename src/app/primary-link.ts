import type { Config } from '../config/types.js';

/**
 * What the primary of `perch --workers` (workers.ts) tells a worker over the IPC channel. The
 * primary reads the configuration file; a worker never does. `start` comes first: the
 * configuration the fleet started with (what a restart-only setting still runs on) and, after a
 * SIGHUP, the one they reloaded, so a restarted worker runs what the others run.
 */
export type PrimaryMessage =
  | { readonly kind: 'start'; readonly config: Config; readonly reloaded?: Config }
  | { readonly kind: 'reload'; readonly config: Config }
  /** The file was refused: each worker counts it (perch.reloadFailed) and keeps its configuration. */
  | { readonly kind: 'reload_failed' }
  /** The first stops draining; a second ends the worker at once. */
  | { readonly kind: 'stop' };

/** Set in a worker's environment by its primary (workers.ts): which worker it is, from 1. */
export const WORKER_ENV = 'PERCH_WORKER';

/** A worker's word that it listens: from then on its death is not a failure to start. */
export const WORKER_READY = { kind: 'ready' } as const;

export interface PrimaryEvents {
  reload(config: Config): void;
  reloadFailed(): void;
  stop(): void;
  /** The primary is gone (its channel closed): no stop or reload will come any more. */
  orphaned(): void;
}

let link: PrimaryLink | undefined;

/**
 * This worker's one channel to its primary, or undefined in a process that is not a worker of
 * `perch --workers`. main.ts asks first thing, so the signals are held (see PrimaryLink) while
 * the rest of perch loads, which on a busy host takes a good part of a second.
 */
export function primaryLink(): PrimaryLink | undefined {
  if (process.env[WORKER_ENV] === undefined || process.send === undefined) return undefined;
  link ??= new PrimaryLink();
  return link;
}

/** The signals a worker hears from its primary, as messages, rather than from the kernel. */
const HELD_SIGNALS = ['SIGHUP', 'SIGINT', 'SIGTERM'] as const;

/**
 * A worker's end of the channel, listening from the worker's first moment: what arrives while
 * the worker is still starting (a reload, a stop) is kept and handed over in order once it
 * serves (`attach`), so a SIGHUP or a SIGTERM during a worker's start is never lost.
 *
 * The signals themselves are held from that moment too: a SIGHUP sent to the process group
 * (`pkill -HUP perch`, a terminal's hangup) or a Ctrl-C would otherwise end a worker still
 * starting (their default action), and the primary would count a failed start for each, then
 * give up on perch. The primary relays them; a worker whose primary is gone before it serves
 * heeds SIGTERM and SIGINT (it has nothing to drain: it exits, status 1).
 */
export class PrimaryLink {
  readonly started: Promise<{ config: Config; reloaded?: Config }>;
  #events: PrimaryEvents | undefined;
  #pending: ((events: PrimaryEvents) => void)[] = [];
  #connected = true;
  readonly #hold = (signal: NodeJS.Signals) => {
    if (signal === 'SIGHUP' || this.#connected) return;
    process.exit(1);
  };

  constructor() {
    for (const signal of HELD_SIGNALS) process.on(signal, this.#hold);
    let begin!: (start: { config: Config; reloaded?: Config }) => void;
    let orphanedEarly!: (error: Error) => void;
    this.started = new Promise((resolve, reject) => {
      begin = resolve;
      orphanedEarly = reject;
    });
    // Awaited by command.ts once perch has loaded: a primary gone before then is not unhandled.
    this.started.catch(() => undefined);
    process.on('message', (message: PrimaryMessage) => {
      switch (message.kind) {
        case 'start':
          return begin(message.reloaded === undefined ? { config: message.config } : { config: message.config, reloaded: message.reloaded });
        case 'reload':
          return this.#deliver((events) => events.reload(message.config));
        case 'reload_failed':
          return this.#deliver((events) => events.reloadFailed());
        case 'stop':
          return this.#deliver((events) => events.stop());
      }
    });
    process.on('disconnect', () => {
      this.#connected = false;
      orphanedEarly(new Error('the primary of perch --workers was gone before this worker had its configuration'));
      this.#deliver((events) => events.orphaned());
    });
  }

  get connected(): boolean {
    return this.#connected;
  }

  /**
   * Hands every event so far, then each as it comes, to `events`, and the signals to the
   * handlers the worker has installed by now.
   */
  attach(events: PrimaryEvents): void {
    // From here on the worker's own handlers (app/signals.ts) decide.
    for (const signal of HELD_SIGNALS) process.off(signal, this.#hold);
    this.#events = events;
    for (const event of this.#pending.splice(0)) event(events);
  }

  /** Tells the primary this worker listens. */
  ready(): void {
    if (this.#connected) process.send?.(WORKER_READY, undefined, {}, () => undefined);
  }

  #deliver(event: (events: PrimaryEvents) => void): void {
    if (this.#events === undefined) this.#pending.push(event);
    else event(this.#events);
  }
}
