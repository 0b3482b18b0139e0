import { write, writeSync } from 'node:fs';

/** A batch is written once it holds this many characters. */
const BATCH_CHARS = 64 * 1024;
/** Longest a line waits for its batch to fill when traffic is light. */
const MAX_DELAY_MS = 100;
/** Characters kept while the sink is slow; past this, new lines are dropped and counted. */
const MAX_PENDING_CHARS = 16 * 1024 * 1024;

/**
 * The log's way to a file descriptor: lines are gathered as strings and joined into one write of
 * about 64 KB (or every 100 ms), written asynchronously so a slow pipe never stalls the event
 * loop. pino's own destination (sonic-boom) costs several microseconds a line at any batch size
 * (its buffer is one growing string measured line by line); gathering an array and joining it
 * once per batch costs a fraction of that, and the access line is written once per request.
 * A sink slower than the logs fills at most 16 MB of memory, then lines are dropped and counted
 * (the count is logged when the sink catches up), rather than perch running out of memory.
 */
export class LineBatcher {
  readonly #fd: number;
  #pending: string[] = [];
  #pendingChars = 0;
  #writing = false;
  #dropped = 0;
  #timer: NodeJS.Timeout | undefined;
  #waiters: (() => void)[] = [];

  constructor(fd: number) {
    this.#fd = fd;
  }

  /** Takes one complete line (with its newline), as pino hands them. */
  write(line: string): boolean {
    if (this.#pendingChars > MAX_PENDING_CHARS) {
      this.#dropped++;
      return true;
    }
    this.#pending.push(line);
    this.#pendingChars += line.length;
    if (this.#pendingChars >= BATCH_CHARS) this.#start();
    else this.#timer ??= setTimeout(() => this.#start(), MAX_DELAY_MS).unref();
    return true;
  }

  /** Calls `done` once every line given so far is written (pino's `logger.flush`). */
  flush(done?: (error?: Error) => void): void {
    if (this.#pending.length === 0 && !this.#writing) {
      done?.();
      return;
    }
    if (done !== undefined) this.#waiters.push(done);
    this.#start();
  }

  /** Writes what is pending now, synchronously: for the last lines of a process that is exiting. */
  flushSync(): void {
    const data = this.#take();
    if (data !== '') writeSync(this.#fd, data);
  }

  #take(): string {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    let data = this.#pending.join('');
    if (this.#dropped > 0) {
      data += `{"level":40,"time":${Date.now()},"msg":"log lines dropped: the log sink was too slow","dropped":${this.#dropped}}\n`;
      this.#dropped = 0;
    }
    this.#pending = [];
    this.#pendingChars = 0;
    return data;
  }

  #start(): void {
    if (this.#writing) return;
    const data = this.#take();
    if (data === '') {
      this.#settle();
      return;
    }
    this.#writing = true;
    this.#writeAll(Buffer.from(data));
  }

  #writeAll(bytes: Buffer): void {
    write(this.#fd, bytes, 0, bytes.length, null, (error, written) => {
      if (error !== null) {
        // A non-blocking pipe that is full: try again shortly. Anything else loses this batch,
        // said once on stderr, since the log itself is what failed.
        if ((error as NodeJS.ErrnoException).code === 'EAGAIN') {
          setTimeout(() => this.#writeAll(bytes), 10).unref();
          return;
        }
        process.stderr.write(`perch: log write failed: ${error.message}\n`);
      } else if (written < bytes.length) {
        this.#writeAll(bytes.subarray(written));
        return;
      }
      this.#writing = false;
      if (this.#pending.length > 0 && (this.#pendingChars >= BATCH_CHARS || this.#waiters.length > 0)) this.#start();
      else {
        if (this.#pending.length > 0) this.#timer ??= setTimeout(() => this.#start(), MAX_DELAY_MS).unref();
        this.#settle();
      }
    });
  }

  #settle(): void {
    if (this.#writing || this.#pending.length > 0) return;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const done of waiters) done();
  }
}
