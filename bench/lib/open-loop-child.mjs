// The open-loop generator's own process (started by open-loop.mjs, pinned to the client CPU).
// Request i is due at start + i / rate whatever happened to earlier ones; its latency runs from
// that due time to the last byte of its answer, so a stall counts against every request it held
// back, including those that could not even be written because every connection was waiting
// (no coordinated omission). A due request goes out on an idle keep-alive connection (idle ones
// are taken in turn, so all of them carry traffic) or waits in one shared FIFO queue for the
// first connection to free up; one request is in flight per connection.
//
// It is a generator, not an HTTP client: it writes one precomputed GET and counts answers by
// Content-Length, which is all the hit path's answers need, so it stays cheap at tens of
// thousands of requests per second. Node's timers tick in whole milliseconds, which would send
// requests up to a millisecond late in bursts; instead the loop sleeps with Atomics.wait (a
// futex, so no CPU) until the next due time, capped at 1 ms, then lets the event loop read
// whatever arrived. The cost of that: an answer arriving during a sleep is timestamped when the
// sleep ends, one inter-request gap later at most (plus the kernel's ~50 µs timer slack); both
// the lateness of each send and that gap are reported.
//
// argv[2] is JSON: { host, port, head (the request bytes, latin1), rate, warmupS, durationS,
// connections, drainS, serverPids, cpu, serverCpu }. Prints `RESULT <json>` and exits.
import { connect } from 'node:net';
import { busyShare, cpuJiffies, cpuSplitOf } from './procs.mjs';
import { percentile } from './stats.mjs';

const cfg = JSON.parse(process.argv[2]);
const REQUEST = Buffer.from(cfg.head, 'latin1');
const HEAD_END = Buffer.from('\r\n\r\n');
const periodMs = 1000 / cfg.rate;
const total = Math.ceil((cfg.warmupS + cfg.durationS) * cfg.rate);
/** Requests due in [firstMeasured, total) are measured: the window is [windowStart, windowEnd). */
const firstMeasured = Math.ceil(cfg.warmupS * cfg.rate);
const measured = total - firstMeasured;

const latencies = new Float64Array(measured);
const lags = new Float64Array(measured);
let answered = 0; // measured requests answered (any status)
let errorStatuses = 0;
let socketErrors = 0;
let failedMeasured = 0; // measured requests lost to a socket error
let sentInWindow = 0;
let answeredInWindow = 0; // answers below 400 completed inside the window, whatever their due time
let maxQueue = 0;

let t0 = 0;
let windowStart = Infinity;
let windowEnd = Infinity;
let next = 0; // index of the next request to fall due
let inWindow = false;
let before;
let after;

/** A FIFO of numbers that grows when full: the requests (by index) waiting for a connection. */
class Queue {
  #items = new Float64Array(4096);
  #head = 0;
  #length = 0;
  get length() {
    return this.#length;
  }
  push(value) {
    if (this.#length === this.#items.length) {
      const bigger = new Float64Array(this.#items.length * 2);
      for (let i = 0; i < this.#length; i++) bigger[i] = this.#items[(this.#head + i) % this.#items.length];
      this.#items = bigger;
      this.#head = 0;
    }
    this.#items[(this.#head + this.#length++) % this.#items.length] = value;
  }
  shift() {
    const value = this.#items[this.#head];
    this.#head = (this.#head + 1) % this.#items.length;
    this.#length--;
    return value;
  }
}

const waiting = new Queue();
const idle = [];
let idleHead = 0;
const conns = [];
// Every socket reads into this one buffer: onread callbacks run one at a time and parse in place.
const readBuffer = Buffer.allocUnsafe(1 << 16);

class Conn {
  socket = null;
  busy = false;
  connected = false;
  due = 0; // due time of the request in flight
  index = -1; // its number, to tell measured requests from the warm-up's
  remaining = -1; // body bytes still to come; -1 while reading a head
  status = 0;
  partial = null; // a head split across reads
}

function open(conn) {
  return new Promise((resolve) => {
    const socket = connect({ host: cfg.host, port: cfg.port, noDelay: true, onread: { buffer: readBuffer, callback: (n, buf) => onRead(conn, buf, n) } });
    conn.socket = socket;
    socket.once('connect', () => {
      conn.connected = true;
      resolve();
      if (waiting.length > 0) send(conn, waiting.shift());
      else idle.push(conn);
    });
    socket.once('error', () => {});
    socket.once('close', () => {
      conn.connected = false;
      if (done) return;
      socketErrors++;
      if (conn.busy && conn.index >= firstMeasured) failedMeasured++;
      conn.busy = false;
      conn.remaining = -1;
      conn.partial = null;
      // The request in flight is lost; the connection comes back for the ones still to go.
      open(conn);
    });
  });
}

function takeIdle() {
  while (idleHead < idle.length) {
    const conn = idle[idleHead++];
    if (idleHead > 1024) {
      idle.splice(0, idleHead);
      idleHead = 0;
    }
    if (conn.connected && !conn.busy) return conn;
  }
  return null;
}

function send(conn, index) {
  conn.busy = true;
  conn.due = t0 + index * periodMs;
  conn.index = index;
  conn.remaining = -1;
  conn.socket.write(REQUEST);
  if (inWindow) sentInWindow++;
}

function dispatchDue(now) {
  while (next < total) {
    const due = t0 + next * periodMs;
    if (due > now) break;
    if (next >= firstMeasured) lags[next - firstMeasured] = now - due;
    const conn = takeIdle();
    if (conn !== null) send(conn, next);
    else {
      waiting.push(next);
      if (waiting.length > maxQueue) maxQueue = waiting.length;
    }
    next++;
  }
}

function onRead(conn, buf, n) {
  let view = buf.subarray(0, n);
  let i = 0;
  while (i < view.length) {
    if (conn.remaining > 0) {
      const take = Math.min(conn.remaining, view.length - i);
      conn.remaining -= take;
      i += take;
      if (conn.remaining === 0) complete(conn);
      continue;
    }
    if (conn.partial !== null) {
      view = Buffer.concat([conn.partial, view.subarray(i)]);
      conn.partial = null;
      i = 0;
    }
    const end = view.indexOf(HEAD_END, i);
    if (end < 0) {
      conn.partial = Buffer.from(view.subarray(i));
      return;
    }
    const head = view.latin1Slice(i, end);
    conn.status = Number(head.slice(9, 12));
    const length = /\r\ncontent-length: *(\d+)/i.exec(head);
    if (length === null) {
      process.stderr.write(`open-loop: an answer without Content-Length: ${head.slice(0, 200)}\n`);
      process.exit(2);
    }
    conn.remaining = Number(length[1]);
    i = end + 4;
    if (conn.remaining === 0) complete(conn);
  }
  dispatchDue(performance.now());
}

function complete(conn) {
  const now = performance.now();
  conn.remaining = -1;
  conn.busy = false;
  if (conn.index >= firstMeasured) {
    latencies[answered++] = now - conn.due;
    if (conn.status >= 400) errorStatuses++;
  }
  if (inWindow && conn.status < 400) answeredInWindow++;
  if (waiting.length > 0) send(conn, waiting.shift());
  else idle.push(conn);
  if (draining && answered + failedMeasured >= measured) finish();
}

function snapshot() {
  return {
    at: performance.now(),
    self: cpuSplitOf(process.pid),
    servers: cfg.serverPids.map((pid) => cpuSplitOf(pid)),
    cores: [cpuJiffies(cfg.cpu), cpuJiffies(cfg.serverCpu)],
  };
}

const pause = new Int32Array(new SharedArrayBuffer(4));
let draining = false;
let done = false;
let drainTimer;

function loop() {
  const now = performance.now();
  if (!inWindow && now >= windowStart && now < windowEnd) {
    before = snapshot();
    inWindow = true;
  }
  dispatchDue(now);
  if (next >= total) {
    after = snapshot();
    inWindow = false;
    draining = true;
    drainTimer = setTimeout(finish, cfg.drainS * 1000);
    if (answered + failedMeasured >= measured) finish();
    return;
  }
  const gap = t0 + next * periodMs - performance.now();
  if (gap > 0) Atomics.wait(pause, 0, 0, Math.min(gap, 1));
  setImmediate(loop);
}

function finish() {
  if (done) return;
  done = true;
  clearTimeout(drainTimer);
  for (const conn of conns) conn.socket.destroy();
  const unanswered = measured - answered - failedMeasured;
  const windowS = (after.at - before.at) / 1000;
  const sum = (field) => after.servers.reduce((s, a, i) => s + a[field] - before.servers[i][field], 0);
  const sorted = latencies.slice(0, answered).sort();
  const sortedLags = lags.sort();
  const result = {
    requestedRate: cfg.rate,
    rps: answeredInWindow / windowS,
    sentRate: sentInWindow / windowS,
    requests: answered,
    windowS,
    socketErrors: socketErrors + unanswered,
    unanswered,
    errorStatuses,
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    p999: percentile(sorted, 99.9),
    max: sorted.length > 0 ? sorted[sorted.length - 1] : NaN,
    lagP50: percentile(sortedLags, 50),
    lagP99: percentile(sortedLags, 99),
    lagMax: sortedLags[sortedLags.length - 1],
    maxQueue,
    generatorCpu: (after.self.user + after.self.system - before.self.user - before.self.system) / windowS,
    serverCpu: (sum('user') + sum('system')) / windowS,
    serverUserCpu: sum('user') / windowS,
    serverSystemCpu: sum('system') / windowS,
    generatorCoreBusy: busyShare(before.cores[0], after.cores[0]),
    serverCoreBusy: busyShare(before.cores[1], after.cores[1]),
  };
  process.stdout.write(`RESULT ${JSON.stringify(result)}\n`, () => process.exit(0));
}

cpuSplitOf(process.pid); // reads CLK_TCK now, not at the window's first snapshot
for (let i = 0; i < cfg.connections; i++) conns.push(new Conn());
await Promise.all(conns.map(open));
t0 = performance.now();
windowStart = t0 + cfg.warmupS * 1000;
windowEnd = t0 + (cfg.warmupS + cfg.durationS) * 1000;
loop();
