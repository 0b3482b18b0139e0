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

/** A worker's word that it listens: from then on its death is not a failure to start. */
export const WORKER_READY = { kind: 'ready' } as const;

export interface PrimaryEvents {
  reload(config: Config): void;
  reloadFailed(): void;
  stop(): void;
  /** The primary is gone (its channel closed): no stop or reload will come any more. */
  orphaned(): void;
}

/**
 * A worker's end of the channel, listening from the worker's first moment: what arrives while
 * the worker is still starting (a reload, a stop) is kept and handed over in order once it
 * serves (`attach`), so a SIGHUP or a SIGTERM during a worker's start is never lost.
 */
export class PrimaryLink {
  readonly started: Promise<{ config: Config; reloaded?: Config }>;
  #events: PrimaryEvents | undefined;
  #pending: ((events: PrimaryEvents) => void)[] = [];
  #connected = true;

  constructor() {
    let begin!: (start: { config: Config; reloaded?: Config }) => void;
    let orphanedEarly!: (error: Error) => void;
    this.started = new Promise((resolve, reject) => {
      begin = resolve;
      orphanedEarly = reject;
    });
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

  /** Hands every event so far, then each as it comes, to `events`. */
  attach(events: PrimaryEvents): void {
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
