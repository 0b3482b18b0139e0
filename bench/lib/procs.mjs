// Child processes for the benchmark: spawned (pinned with taskset when available), tracked, and
// always killed when the orchestrator exits, whether normally, on an error or on SIGINT/SIGTERM.
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import os from 'node:os';

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
 * 8 KB) for error messages.
 */
export function start(name, command, args, { cpu = null, cwd, env, stdout = 'pipe' } = {}) {
  const [file, argv] = cpu === null ? [command, args] : ['taskset', ['-c', String(cpu), command, ...args]];
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
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (Number(fields[11]) + Number(fields[12])) / clockTicks();
  } catch {
    return NaN;
  }
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
