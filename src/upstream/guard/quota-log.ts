import { CLOCK_GRANULARITY_MS } from './provider-state.js';

/**
 * Slices a long quota window is kept in: each `windowMs / QUOTA_SLICES` wide, so a call counts
 * at most that much longer than in a log of every call.
 */
export const QUOTA_SLICES = 1024;
/** Slots for the slices: a slot is reused only once its slice has left the window. */
const SLOTS = QUOTA_SLICES + 2;
/**
 * Up to this many requests a quota keeps every answered call's mark (8 bytes each, up to this
 * many marks): its admissions are exactly those of a sliding log. Above, slices; the same once
 * more calls than this are in the window (Redis admitted them for the fleet).
 */
export const EXACT_QUOTA_LIMIT = 4096;

/** Where answered calls are counted: [mark, count] pairs that each leave the window at mark + window. */
interface Answered {
  /** Answers the last call's name, `mark:rank` (as `entries` lists it), or undefined if aged already. */
  add(mark: number, count: number): string | undefined;
  /** Drops what has aged by `now` and answers how many calls are left. */
  size(now: number): number;
  /** The calls counted, oldest first. */
  entries(): [mark: number, count: number][];
}

/**
 * The quota's sliding log in memory bounded by its configuration, not by the traffic: answered
 * calls are kept as marks in a ring of at most EXACT_QUOTA_LIMIT while the limit is small, per
 * slice of the window above that (or once the ring is full);
 * calls in flight by id until their answer (as many as are in flight). A call answered in a
 * slice counts as if answered at the slice's last millisecond, so it leaves the window at most
 * one slice later than in an exact log, never earlier: the provider still never sees more than
 * `limit` calls in any window, and a refusal waits at most one slice more. A month's window of
 * a million calls is 16 KiB and a scan of 1,026 slots per admission, where a log of every call
 * held about 500 MiB and sorted a million marks per refusal.
 */
export class QuotaLog {
  readonly windowMs: number;
  readonly limit: number;
  #answered: Answered;
  readonly #aged: (mark: number, now: number) => boolean;
  /** Calls not answered yet: id -> when their window membership starts to age (end of the lease). */
  readonly inFlight = new Map<string, number>();

  constructor(windowMs: number, limit: number) {
    this.windowMs = windowMs;
    this.limit = limit;
    this.#aged = (mark: number, now: number) => mark + windowMs + CLOCK_GRANULARITY_MS <= now;
    // The ring holds EXACT_QUOTA_LIMIT marks whatever the limit: a log also holds the calls the
    // fleet's Redis admitted (more than this instance's share), and all of them go back to a Redis
    // that restarted empty.
    this.#answered = limit <= EXACT_QUOTA_LIMIT ? new MarkRing(EXACT_QUOTA_LIMIT, this.#aged) : new Slices(windowMs, this.#aged);
  }

  /** A call in flight until its answer (`settle`), counted until `mark` + the window meanwhile. */
  hold(id: string, mark: number): void {
    this.inFlight.set(id, mark);
  }

  /**
   * The call `id` was answered at `now`: answers the name it has among the answered calls from
   * now on (`mark:rank`, as `answered` lists them), undefined if it was not in flight here.
   */
  settle(id: string, now: number): string | undefined {
    if (!this.inFlight.delete(id)) return undefined;
    return this.#add(now, 1, now);
  }

  /** Adds answered calls; a ring they would overflow becomes slices, so that none is dropped. */
  #add(mark: number, count: number, now: number): string | undefined {
    const answered = this.#answered;
    if (answered instanceof MarkRing && answered.size(now) + count > EXACT_QUOTA_LIMIT) {
      const slices = new Slices(this.windowMs, this.#aged);
      for (const [at, n] of answered.entries()) slices.add(at, n);
      this.#answered = slices;
    }
    return this.#answered.add(mark, count);
  }

  /**
   * Milliseconds until the log admits one more call under its limit; 0 when it does now, and
   * `pollMs` when it waits for a call in flight, whose window ends a window after its answer.
   */
  wait(now: number, pollMs: number): number {
    let size = this.#answered.size(now);
    for (const [id, mark] of this.inFlight) {
      if (mark + this.windowMs + CLOCK_GRANULARITY_MS <= now) this.inFlight.delete(id);
      else size++;
    }
    if (size < this.limit) return 0;
    // The (size - limit)th oldest mark must leave before one more call fits; refusals only.
    const marks: [mark: number, count: number, inFlight: boolean][] = this.#answered.entries().map(([mark, count]) => [mark, count, false]);
    for (const mark of this.inFlight.values()) marks.push([mark, 1, true]);
    marks.sort((a, b) => a[0] - b[0]);
    let before = size - this.limit;
    for (const [mark, count, inFlight] of marks) {
      if (before >= count) {
        before -= count;
        continue;
      }
      // A call in flight leaves a window after its answer, which nobody knows yet; a slice
      // still filling leaves a window after its last millisecond.
      return inFlight && mark > now ? pollMs : mark + this.windowMs + CLOCK_GRANULARITY_MS - now;
    }
    return pollMs;
  }

  /** The answered calls counted, as [mark, count], for a write-back. */
  answered(now: number): [mark: number, count: number][] {
    this.#answered.size(now);
    return this.#answered.entries();
  }

  /** The same calls in a log of another window or limit (a reload changed it). */
  rebuilt(windowMs: number, limit: number, now: number): QuotaLog {
    const log = new QuotaLog(windowMs, limit);
    for (const [mark, count] of this.answered(now)) log.#add(mark, count, now);
    for (const [id, mark] of this.inFlight) log.hold(id, mark);
    return log;
  }
}

/** Answered calls' marks in order, up to `capacity` of them (QuotaLog turns a full one into slices). */
class MarkRing implements Answered {
  readonly #marks: Float64Array;
  readonly #aged: (mark: number, now: number) => boolean;
  #head = 0;
  #length = 0;

  constructor(capacity: number, aged: (mark: number, now: number) => boolean) {
    this.#marks = new Float64Array(capacity);
    this.#aged = aged;
  }

  add(mark: number, count: number): string {
    const capacity = this.#marks.length;
    // Kept in order; a clock that stepped back makes a mark count longer, never shorter.
    const last = this.#length > 0 ? this.#marks[(this.#head + this.#length - 1) % capacity]! : -Infinity;
    const at = Math.max(mark, last);
    for (let i = 0; i < Math.min(count, capacity); i++) {
      if (this.#length === capacity) {
        this.#head = (this.#head + 1) % capacity;
        this.#length--;
      }
      this.#marks[(this.#head + this.#length) % capacity] = at;
      this.#length++;
    }
    let rank = 0;
    while (rank + 1 < this.#length && this.#marks[(this.#head + this.#length - 2 - rank) % capacity] === at) rank++;
    return `${at}:${rank}`;
  }

  size(now: number): number {
    while (this.#length > 0 && this.#aged(this.#marks[this.#head]!, now)) {
      this.#head = (this.#head + 1) % this.#marks.length;
      this.#length--;
    }
    return this.#length;
  }

  entries(): [number, number][] {
    const out: [number, number][] = [];
    for (let i = 0; i < this.#length; i++) {
      const mark = this.#marks[(this.#head + i) % this.#marks.length]!;
      const last = out[out.length - 1];
      if (last !== undefined && last[0] === mark) last[1]++;
      else out.push([mark, 1]);
    }
    return out;
  }
}

/** Answered calls counted per slice of the window. */
class Slices implements Answered {
  readonly #width: number;
  readonly #aged: (mark: number, now: number) => boolean;
  /** Per slot: the slice it holds, and its count. */
  readonly #slice = new Float64Array(SLOTS).fill(-Infinity);
  readonly #count = new Float64Array(SLOTS);

  constructor(windowMs: number, aged: (mark: number, now: number) => boolean) {
    this.#width = Math.max(1, Math.ceil(windowMs / QUOTA_SLICES));
    this.#aged = aged;
  }

  add(mark: number, count: number): string | undefined {
    const slice = Math.floor(mark / this.#width);
    const slot = ((slice % SLOTS) + SLOTS) % SLOTS;
    if (this.#slice[slot] !== slice) {
      // A newer slice in the slot means this one has left the window already.
      if (this.#slice[slot]! > slice) return undefined;
      this.#slice[slot] = slice;
      this.#count[slot] = 0;
    }
    this.#count[slot]! += count;
    return `${this.#lastMs(slice)}:${this.#count[slot]! - 1}`;
  }

  size(now: number): number {
    let size = 0;
    for (let slot = 0; slot < SLOTS; slot++) {
      const slice = this.#slice[slot]!;
      if (slice === -Infinity) continue;
      if (this.#aged(this.#lastMs(slice), now)) this.#slice[slot] = -Infinity;
      else size += this.#count[slot]!;
    }
    return size;
  }

  entries(): [number, number][] {
    const out: [number, number][] = [];
    for (let slot = 0; slot < SLOTS; slot++) {
      const slice = this.#slice[slot]!;
      if (slice !== -Infinity) out.push([this.#lastMs(slice), this.#count[slot]!]);
    }
    return out.sort((a, b) => a[0] - b[0]);
  }

  #lastMs(slice: number): number {
    return (slice + 1) * this.#width - 1;
  }
}
