// Child processes for the benchmark: spawned (pinned with taskset when available), tracked, and
// always killed when the orchestrator exits, whether normally, on an error or on SIGINT/SIGTERM.
import { execFileSync, spawn } from 'node:child_process';
import { accessSync, constants, readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import os from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';

const children = new Set();
let handlersInstalled = false;

function hasTaskset() {
  try {
    execFileSync('taskset', ['-V'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/**
 * The path to run `name` by: as found on PATH, else Debian's /usr/sbin (where nginx and varnishd
 * live, often not on a normal user's PATH), else `name` itself (the caller reports it missing).
 */
export function sbinBinary(name) {
  const dirs = [...(process.env.PATH ?? '').split(':').filter(Boolean), '/usr/sbin'];
  for (const dir of dirs) {
    try {
      accessSync(join(dir, name), constants.X_OK);
      return join(dir, name);
    } catch {
      // not here
    }
  }
  return name;
}

/** Where servers and the load generator run; null cpus mean "not pinned". */
export function pinning(options) {
  const cpus = os.cpus().length;
  if (!hasTaskset()) return { serverCpu: null, clientCpu: null, note: 'taskset not found: processes are not pinned' };
  if (cpus < 2) return { serverCpu: null, clientCpu: null, note: `only ${cpus} CPU: processes are not pinned` };
  return { serverCpu: options.serverCpu, clientCpu: options.clientCpu, note: `servers on CPU ${options.serverCpu}, load generator on CPU ${options.clientCpu}` };
}

/** Pins this very process (the load generator) to one CPU. */
export function pinSelf(cpu) {
  if (cpu === null) return;
  execFileSync('taskset', ['-a', '-pc', String(cpu), String(process.pid)], { stdio: 'ignore' });
}

/** Installs exit/SIGINT/SIGTERM handlers that SIGKILL every child still alive. */
export function installCleanup() {
  if (handlersInstalled) return;
  handlersInstalled = true;
  process.on('exit', killAllNow);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(signal, () => {
      process.stderr.write(`\nbench: ${signal}, stopping every child process\n`);
      killAllNow();
      process.exit(130);
    });
  }
}

function killAllNow() {
  for (const child of children) {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
}

/**
 * Spawns `command args` pinned to `cpu` (taskset -c, which execs, so the pid is the program's).
 * stdout is piped unless `stdout` is given (a file descriptor or 'ignore'); stderr is kept (last
 * 8 KB) for error messages. `ownSession`: in a session of its own (setsid), so that with Linux's
 * autogroup scheduling it gets the share of a core perch gets (lib/shared-core.mjs).
 */
export function start(name, command, args, { cpu = null, cwd, env, stdout = 'pipe', ownSession = false } = {}) {
  // `setsid` execs in place (a spawned child leads no process group), so the PID stays the server's.
  const [cmd, cmdArgs] = ownSession ? ['setsid', [command, ...args]] : [command, args];
  const [file, argv] = cpu === null ? [cmd, cmdArgs] : ['taskset', ['-c', String(cpu), cmd, ...cmdArgs]];
  const child = spawn(file, argv, { cwd, env: env ?? process.env, stdio: ['ignore', stdout, 'pipe'] });
  children.add(child);
  let stderr = '';
  child.stderr.on('data', (data) => {
    stderr = (stderr + data.toString()).slice(-8192);
  });
  const exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      children.delete(child);
      resolve({ code, signal });
    });
    child.once('error', (error) => {
      children.delete(child);
      stderr += String(error);
      resolve({ code: -1, signal: null, error });
    });
  });
  return {
    name,
    child,
    get pid() {
      return child.pid;
    },
    stderr: () => stderr,
    exited,
    alive: () => child.exitCode === null && child.signalCode === null,
    /** SIGTERM (graceful: lets perch flush logs and write a --cpu-prof profile), SIGKILL after `graceMs`. */
    async stop(graceMs = 5000) {
      if (child.exitCode !== null || child.signalCode !== null) return exited;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      const result = await exited;
      clearTimeout(timer);
      return result;
    },
  };
}

/** Resolves with the first stdout line matching `pattern`, or rejects when the child exits or time runs out. */
export function waitForLine(proc, pattern, timeoutMs = 10_000) {
  return new Promise((resolve, reject) => {
    let buffer = '';
    const timer = setTimeout(() => done(new Error(`${proc.name}: no line matching ${pattern} within ${timeoutMs} ms; stderr: ${proc.stderr()}`)), timeoutMs);
    const onData = (data) => {
      buffer += data.toString();
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        const match = pattern.exec(line);
        if (match) return done(null, match);
      }
    };
    const onExit = () => done(new Error(`${proc.name} exited before it was ready: ${proc.stderr().trim()}`));
    function done(error, match) {
      clearTimeout(timer);
      proc.child.stdout.off('data', onData);
      proc.child.off('exit', onExit);
      proc.child.stdout.resume(); // keep draining so the child never blocks on a full pipe
      if (error) reject(error);
      else resolve(match);
    }
    proc.child.stdout.on('data', onData);
    proc.child.once('exit', onExit);
  });
}

/** A TCP port free on 127.0.0.1 a moment ago (for programs that cannot report a port 0 choice). */
export async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Resident set size and its peak, in bytes, from /proc (Linux). */
export function memoryOf(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
  return { rss: kb('VmRSS'), peak: kb('VmHWM') };
}

/** CPU seconds (user + system) a process has used so far, from /proc (Linux); NaN elsewhere. */
export function cpuSecondsOf(pid) {
  const { user, system } = cpuSplitOf(pid);
  return user + system;
}

/**
 * User and system CPU seconds a process has used so far, from /proc (Linux); NaN elsewhere. The
 * system share holds the kernel's side of every request (socket reads and writes, loopback TCP,
 * epoll), which grows per request when a slower server leaves its client asleep more often.
 */
export function cpuSplitOf(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return { user: Number(fields[11]) / clockTicks(), system: Number(fields[12]) / clockTicks() };
  } catch {
    return { user: NaN, system: NaN };
  }
}

/** `pid` and every process below it (Linux /proc): a server's CPU includes its children's. */
export function processTree(pid) {
  const parents = new Map();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // field 4 (ppid) is the second after the ")" closing the command name
      parents.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      // exited while listing
    }
  }
  const tree = [pid];
  for (let i = 0; i < tree.length; i++) for (const [child, parent] of parents) if (parent === tree[i]) tree.push(child);
  return tree;
}

/**
 * Jiffies of one CPU from /proc/stat, busy (anything but idle and iowait) and total (Linux); null
 * elsewhere or for a null cpu. Over a run, busy/total beside the bench's own processes' share says
 * whether other processes used the core. Interrupt time counts as busy: with tick accounting a
 * process's CPU time includes the softirq time spent in its context (loopback networking, up to
 * a fifth of a server's core), so leaving it out would show a server using more than its core.
 */
export function cpuJiffies(cpu) {
  if (cpu === null) return null;
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n').find((l) => l.startsWith(`cpu${cpu} `));
    const fields = line.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is in user too
    const total = fields.slice(0, 8).reduce((a, b) => a + b, 0);
    return { busy: total - fields[3] - fields[4], total };
  } catch {
    return null;
  }
}

/** busy/total between two `cpuJiffies` snapshots; NaN when either is missing. */
export function busyShare(before, after) {
  if (before === null || after === null || after.total === before.total) return NaN;
  return (after.busy - before.busy) / (after.total - before.total);
}

let ticks;
function clockTicks() {
  if (ticks === undefined) {
    try {
      ticks = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    } catch {
      ticks = 100;
    }
  }
  return ticks;
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Resolves once `url` answers HTTP (any status): a server started by `start` is ready. Rejects,
 * stopping it, when it exits first or does not answer within `timeoutMs`.
 */
export async function waitUntilServing(proc, url, { timeoutMs, pollMs = 50 }) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (!proc.alive()) {
      await proc.exited;
      throw new Error(`${proc.name} exited at start: ${proc.stderr().trim() || '(no stderr)'}`);
    }
    try {
      const res = await request(url, { headersTimeout: 1000, bodyTimeout: 1000 });
      await res.body.dump();
      return;
    } catch {
      if (Date.now() > deadline) {
        await proc.stop();
        throw new Error(`${proc.name} did not answer within ${timeoutMs / 1000} s: ${proc.stderr().trim()}`);
      }
      await sleep(pollMs);
    }
  }
}
