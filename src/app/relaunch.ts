import { spawn } from 'node:child_process';
import { HEAP_SIZED_ENV } from './heap-size.js';

/** The signals perch acts on (signals.ts), passed on where the relaunched perch is a child. */
const FORWARDED: readonly NodeJS.Signals[] = ['SIGTERM', 'SIGINT', 'SIGHUP'];

type Execve = (file: string, args: string[], env: NodeJS.ProcessEnv) => never;

/**
 * Runs this same command again with `flags` before the script, `extraEnv` added and
 * `HEAP_SIZED_ENV` set: V8 reads its heap limits, and glibc its arena limit, only when the
 * process starts. Where node has `process.execve` (22.15+), this process becomes the new one, so
 * the PID, the signals and the exit status are as if it had started that way. On Node 20 a child
 * runs it on this process's stdio; this one stays as a launcher that passes signals on and exits
 * as the child did, at the cost of one idle node process (docs/operations.md, Sizing memory and
 * cores, has its RSS).
 */
export function relaunch(flags: readonly string[], extraEnv: Readonly<Record<string, string>>): void {
  const args = [...flags, ...process.execArgv, ...process.argv.slice(1)];
  const env = { ...process.env, ...extraEnv, [HEAP_SIZED_ENV]: '1' };
  const execve = (process as unknown as { execve?: Execve }).execve;
  if (typeof execve === 'function') {
    try {
      execve(process.execPath, [process.execPath, ...args], env);
    } catch {
      // A system that refuses execve still gets perch, as a child.
    }
  }
  // A process group of its own: a terminal's Ctrl-C reaches the launcher alone, which passes it
  // on once (twice would be the "second stop signal" that skips draining).
  const child = spawn(process.execPath, args, { env, stdio: ['inherit', 'inherit', 'inherit', 'ipc'], detached: true });
  for (const signal of FORWARDED) process.on(signal, () => child.kill(signal));
  child.on('error', (error) => {
    process.stderr.write(`perch: could not relaunch with ${flags.join(' ')}: ${error.message}\n`);
    process.exit(1);
  });
  child.on('exit', (code, signal) => {
    if (signal === null) process.exit(code ?? 1);
    for (const forwarded of FORWARDED) process.removeAllListeners(forwarded);
    process.kill(process.pid, signal);
  });
}

/**
 * What `bin/perch` execs in place of itself: `NAME=value` words for `env`, then `node` and its
 * flags, each word free of spaces. Sizing the heap in the shell's exec, before node starts, needs
 * no launcher on a node without `process.execve` (Node 20), and is the same on every version.
 */
export function execWords(flags: readonly string[], extraEnv: Readonly<Record<string, string>>): string[] {
  const env = { ...extraEnv, [HEAP_SIZED_ENV]: '1' };
  return [...Object.entries(env).map(([name, value]) => `${name}=${value}`), 'node', ...flags];
}

/**
 * In a perch that a Node 20 launcher runs as its child: a launcher gone without passing on a
 * signal (SIGKILL, say) must not leave perch running unseen, so its going is a stop signal.
 */
export function followLauncher(stop: () => void): void {
  if (process.env[HEAP_SIZED_ENV] !== '1' || process.channel === undefined) return;
  process.channel.unref();
  process.once('disconnect', stop);
}
