import { writeSync, writev } from 'node:fs';

/** A batch is written once it holds this many bytes. */
const BATCH_BYTES = 64 * 1024;
/** Longest a line waits for its batch to fill when traffic is light. */
const MAX_DELAY_MS = 100;
/** Bytes kept while the sink is slow; past this, new lines are dropped and counted. */
const MAX_PENDING_BYTES = 16 * 1024 * 1024;
/** Batch buffers kept for reuse once written, so steady logging allocates none. */
const SPARE_BUFFERS = 4;
/**
 * The most a write(2) to a pipe may carry and still be atomic (POSIX PIPE_BUF, 4096 on Linux):
 * such a write lands whole or, on a full non-blocking pipe, not at all. A Unix socket (what a
 * process manager often gives as stdout) takes a write this small in one piece too.
 */
export const PIPE_BUF = 4096;

export interface LineBatcherOptions {
  /**
   * Each write(2) carries whole lines and at most PIPE_BUF bytes (a longer line goes alone), for
   * processes that share one stdout (`perch --workers`): a 64 KB write to a pipe that backs up
   * is taken in parts, and another process's lines land between them, splicing lines. Costs a
   * write per 4 KB rather than per batch.
   */
  readonly atomicLines?: boolean;
}

/**
 * The log's way to a file descriptor: each line is encoded straight into a 64 KB buffer, and full
 * buffers (or whatever is there every 100 ms) go out in one asynchronous `writev`, so a slow pipe
 * never stalls the event loop. pino's own destination (sonic-boom) costs several microseconds a
 * line (its buffer is one growing string measured line by line); gathering strings and joining
 * them once per batch still copied every line twice more (join, then encode). Here a line is
 * copied once, by `buffer.write`, and the access line is written once per request.
 * A sink slower than the logs fills at most 16 MB of memory, then lines are dropped and counted
 * (the count is logged when the sink catches up), rather than perch running out of memory.
 */
export class LineBatcher {
  readonly #fd: number;
  /** Filled batches waiting for the write in flight. */
  #full: Buffer[] = [];
  #current: Buffer = Buffer.allocUnsafe(BATCH_BYTES);
  #used = 0;
  #pendingBytes = 0;
  #spares: Buffer[] = [];
  #writing = false;
  #dropped = 0;
  #timer: NodeJS.Timeout | undefined;
  /**
   * The next try of a write a full non-blocking pipe refused. Unref'd, as the batching timer is,
   * until someone waits for the lines (a stop's flush): then the process must not end under them
   * just because nothing else is left to run.
   */
  #retry: NodeJS.Timeout | undefined;
  #waiters: (() => void)[] = [];
  readonly #atomicLines: boolean;

  constructor(fd: number, options: LineBatcherOptions = {}) {
    this.#fd = fd;
    this.#atomicLines = options.atomicLines === true;
  }

  /** Takes one complete line (with its newline), as pino hands them. */
  write(line: string): boolean {
    if (this.#pendingBytes > MAX_PENDING_BYTES) {
      this.#dropped++;
      return true;
    }
    // UTF-8 takes at most 3 bytes per UTF-16 unit; a line that might not fit starts a new batch.
    // The batch it ends goes out now: with lines over about 340 characters (the access line with
    // a user agent) this, not the full-batch check below, ends nearly every batch, and batches
    // left for the timer piled up faster than the spares came back, each a new 64 KB buffer.
    if (this.#used + line.length * 3 > this.#current.length) {
      this.#seal();
      this.#start();
      if (line.length * 3 > this.#current.length) {
        this.#append(Buffer.from(line, 'utf8'));
        this.#start();
        return true;
      }
    }
    const written = this.#current.write(line, this.#used, 'utf8');
    this.#used += written;
    this.#pendingBytes += written;
    if (this.#used >= BATCH_BYTES - 1024) {
      this.#seal();
      this.#start();
    } else this.#arm();
    return true;
  }

  /** Calls `done` once every line given so far is written (pino's `logger.flush`). */
  flush(done?: (error?: Error) => void): void {
    if (this.#used === 0 && this.#full.length === 0 && !this.#writing) {
      done?.();
      return;
    }
    if (done !== undefined) {
      this.#waiters.push(done);
      this.#retry?.ref();
    }
    this.#start();
  }

  /**
   * Writes what is pending now, synchronously: for the last lines of a process that is exiting.
   * A refused write (a full non-blocking pipe, a closed one) ends it: the exit must go on.
   */
  flushSync(): void {
    for (const buffer of this.#take()) {
      for (let at = 0; at < buffer.length; ) {
        try {
          at += writeSync(this.#fd, buffer, at);
        } catch {
          return;
        }
      }
    }
  }

  /** Moves the filling buffer's lines to the queue of full batches. */
  #seal(): void {
    if (this.#used === 0) return;
    this.#full.push(this.#current.subarray(0, this.#used));
    this.#current = this.#spares.pop() ?? Buffer.allocUnsafe(BATCH_BYTES);
    this.#used = 0;
  }

  #append(buffer: Buffer): void {
    this.#full.push(buffer);
    this.#pendingBytes += buffer.length;
  }

  #take(): Buffer[] {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#seal();
    if (this.#dropped > 0) {
      this.#append(Buffer.from(`{"level":40,"time":${Date.now()},"msg":"log lines dropped: the log sink was too slow","dropped":${this.#dropped}}\n`));
      this.#dropped = 0;
    }
    const taken = this.#full;
    this.#full = [];
    this.#pendingBytes = 0;
    return this.#atomicLines ? wholeLines(taken, PIPE_BUF) : taken;
  }

  #start(): void {
    if (this.#writing) return;
    const buffers = this.#take();
    if (buffers.length === 0) {
      this.#settle();
      return;
    }
    this.#writing = true;
    this.#writeAll(buffers, buffers);
  }

  /** `batch`: every buffer of this write, returned to the spares once all of it is written. */
  #writeAll(buffers: Buffer[], batch: readonly Buffer[]): void {
    writev(this.#fd, this.#atomicLines ? buffers.slice(0, 1) : buffers, null, (error, written) => {
      if (error !== null) {
        // A non-blocking pipe that is full: try again shortly. Anything else loses this batch,
        // said once on stderr, since the log itself is what failed.
        if ((error as NodeJS.ErrnoException).code === 'EAGAIN') {
          this.#retry = setTimeout(() => {
            this.#retry = undefined;
            this.#writeAll(buffers, batch);
          }, 10);
          if (this.#waiters.length === 0) this.#retry.unref();
          return;
        }
        process.stderr.write(`perch: log write failed: ${error.message}\n`);
      } else {
        const rest = unwritten(buffers, written);
        if (rest.length > 0) {
          this.#writeAll(rest, batch);
          return;
        }
      }
      for (const buffer of batch) {
        // A batch cut into pieces comes back once, by its first piece.
        if (buffer.byteOffset === 0 && buffer.buffer.byteLength === BATCH_BYTES && this.#spares.length < SPARE_BUFFERS) this.#spares.push(Buffer.from(buffer.buffer, buffer.byteOffset, BATCH_BYTES));
      }
      this.#writing = false;
      if (this.#full.length > 0 || (this.#used > 0 && this.#waiters.length > 0)) this.#start();
      else {
        // The timer may have fired during this write and found it busy: lines left must not
        // wait for the next batch to fill.
        if (this.#used > 0) this.#arm();
        this.#settle();
      }
    });
  }

  /** Writes the filling batch within MAX_DELAY_MS, however few lines it holds. */
  #arm(): void {
    this.#timer ??= setTimeout(() => {
      this.#timer = undefined;
      this.#start();
    }, MAX_DELAY_MS).unref();
  }

  #settle(): void {
    if (this.#writing || this.#used > 0 || this.#full.length > 0) return;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const done of waiters) done();
  }
}

/**
 * `buffers` (each whole lines) cut into pieces of whole lines of at most `max` bytes; a line
 * longer than `max` is a piece by itself. Pieces are views: nothing is copied.
 */
export function wholeLines(buffers: readonly Buffer[], max: number): Buffer[] {
  const pieces: Buffer[] = [];
  for (const buffer of buffers) {
    let at = 0;
    while (buffer.length - at > max) {
      let end = buffer.lastIndexOf(0x0a, at + max - 1);
      if (end < at) end = buffer.indexOf(0x0a, at + max);
      if (end === -1) end = buffer.length - 1;
      pieces.push(buffer.subarray(at, end + 1));
      at = end + 1;
    }
    if (at < buffer.length) pieces.push(buffer.subarray(at));
  }
  return pieces;
}

/** What a `writev` of `buffers` left unwritten after writing `written` bytes. */
function unwritten(buffers: readonly Buffer[], written: number): Buffer[] {
  let i = 0;
  while (i < buffers.length && written >= buffers[i]!.length) written -= buffers[i++]!.length;
  if (i === buffers.length) return [];
  return [buffers[i]!.subarray(written), ...buffers.slice(i + 1)];
}
