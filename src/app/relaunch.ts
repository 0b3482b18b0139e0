import { HEAP_SIZED_ENV, HEAP_SIZING_ENV } from './heap-size.js';

/**
 * Runs this same command again with `flags` before the script, `extraEnv` added and
 * `HEAP_SIZED_ENV` set: V8 reads its heap limits, and glibc its arena limit, only when the
 * process starts. `process.execve` makes this process the new one, so the PID, the signals and
 * the exit status are as if it had started that way, with no launcher beside it. Never returns:
 * a system that refuses the exec stops perch with the reason and the way around it.
 */
export function relaunch(flags: readonly string[], extraEnv: Readonly<Record<string, string>>): never {
  const args = [...flags, ...process.execArgv, ...process.argv.slice(1)];
  const env = { ...process.env, ...extraEnv, [HEAP_SIZED_ENV]: '1' };
  try {
    return process.execve!(process.execPath, [process.execPath, ...args], env);
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new Error(`could not restart node with ${flags.join(' ')} to size the heap (${reason}); ${HEAP_SIZING_ENV}=off keeps node's own limits`);
  }
}
