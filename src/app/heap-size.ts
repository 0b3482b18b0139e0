import { cachedDataVersionTag, setFlagsFromString } from 'node:v8';
import type { Config } from '../config/types.js';
import { heapNeeded, userInitialOldSpaceMib, userOldSpaceMib, userSemiSpaceMib } from './advice.js';

const MIB = 1024 * 1024;

/**
 * Set in the environment of the process perch relaunches with its own heap flags, so that
 * process knows the flags in its `execArgv` are perch's and does not relaunch again.
 */
export const HEAP_SIZED_ENV = 'PERCH_HEAP_SIZED';

/** `off` in the environment keeps Node's own heap settings (and no relaunch). */
export const HEAP_SIZING_ENV = 'PERCH_HEAP_SIZING';

/**
 * The young generation's semi-space perch asks for, in MiB, unless the user passes their own
 * `--max-semi-space-size`. Node's default grows it to 16 MiB (Node 20) or 32 MiB (Node 24) under
 * load, three times that of RSS for the young generation alone; a fill with 4 MiB measured the
 * same rate. Hits pay for it in scavenges: 16 MiB served about 5% more of them for about 24 MiB
 * more RSS after a fill (docs/operations.md, Sizing memory and cores), a trade left to the
 * operator.
 */
export const SEMI_SPACE_MIB = 4;

/**
 * The share of `cache.memory.max_bytes` below which V8 skips full collections
 * (`--initial-old-space-size`: V8 keeps it as the least its old-generation limit falls to after a
 * collection, capped at half the old space, which this never reaches). Left to itself, V8 set
 * that limit a few MiB above what was live, and counts against it the external memory allocated
 * since the last full collection, which includes every body perch stores: it ran a full
 * collection every 0.6 s under hits and every 0.65 s under misses (63-75 ms of concurrent marking
 * a cycle on its worker threads), and on a core shared with those threads the misses that waited
 * for them were the miss tail. At 128 MiB, 3/8 (48 MiB) held 4-5 MiB more RSS after a fill of
 * ~10 KB pages and none after one of small users, where 64 MiB held 11-12 MiB more (the runs are
 * in README.md's git history).
 */
export const INITIAL_OLD_SPACE_SHARE = 3 / 8;

/** glibc reads its malloc arena limit from this variable when a process starts. */
export const MALLOC_ARENA_ENV = 'MALLOC_ARENA_MAX';

/**
 * glibc's malloc arenas perch asks for when it relaunches, unless the environment sets
 * `MALLOC_ARENA_MAX` already. By default glibc gives each thread that allocates an arena of its
 * own, up to 8 per core; V8's compiler and GC threads and libuv's pool each keep what they freed
 * there, a few MiB apiece. One arena held 5-8 MiB less RSS after a fill on Node 20 and 15-21 MiB
 * less on Node 24, with hits and misses as fast on one core (docs/performance.md); two arenas saved
 * about nothing on Node 20. Other C libraries (musl) ignore the variable.
 */
export const MALLOC_ARENAS = 1;

/**
 * The V8 flag perch also starts node with: WebAssembly stays on Liftoff, V8's baseline compiler
 * for it. undici parses the upstreams' HTTP/1.1 with llhttp compiled to WebAssembly, and once that
 * is hot V8 recompiles it with its optimizing compiler on a worker thread. That compilation's
 * working memory comes from malloc: the first 64 concurrent misses of a new perch grew glibc's
 * heap from about 11 to 43 MiB on Node 20 (about +10 MiB on Node 24), and glibc kept it after
 * the compilation freed it, as free chunks below memory still in use. With the flag the heap
 * stayed where it started; llhttp's work costs about 4 µs more per upstream request
 * (docs/performance.md). V8 marks the flag "for testing", so perch passes it only to a node that
 * knows it.
 */
export const WASM_BASELINE_FLAG = '--liftoff-only';

let wasmBaselineKnown: boolean | undefined;

/**
 * Whether this node's V8 takes `WASM_BASELINE_FLAG`: a V8 that knows a flag changes its flag hash
 * when the flag is set (and prints an error for one it does not know, which start-up would turn
 * into "bad option"). Sets it in this process, which is the one about to exec or relaunch.
 */
function knowsWasmBaselineFlag(): boolean {
  if (wasmBaselineKnown === undefined) {
    const before = cachedDataVersionTag();
    setFlagsFromString(WASM_BASELINE_FLAG);
    wasmBaselineKnown = cachedDataVersionTag() !== before;
  }
  return wasmBaselineKnown;
}

/** Whether node's own flags leave WebAssembly on Liftoff: the last of `--liftoff-only` and its negation wins. */
function liftoffOnly(execArgv: readonly string[]): boolean {
  const last = execArgv.filter((flag) => /^--(no-)?liftoff[-_]only$/.test(flag)).at(-1);
  return last !== undefined && !last.startsWith('--no-');
}

/**
 * The heap settings a process runs with, and who chose them; the first log line says so, with
 * V8's resulting limit beside them.
 */
export type HeapSettings =
  | {
      readonly set_by: 'perch';
      readonly old_space_mib: number;
      readonly semi_space_mib: number;
      readonly initial_old_space_mib: number;
      readonly malloc_arena_max: string;
      /** Whether node runs with `WASM_BASELINE_FLAG`. */
      readonly wasm_liftoff_only: boolean;
    }
  | { readonly set_by: 'user'; readonly old_space_mib: number }
  | { readonly set_by: 'node' };

/** What `main` does about the heap before it serves. */
export type HeapPlan =
  | { readonly kind: 'relaunch'; readonly flags: readonly string[]; readonly env: Readonly<Record<string, string>> }
  | { readonly kind: 'serve'; readonly settings: HeapSettings };

/**
 * The old-space limit perch sets: room for a full memory tier's objects (`heapNeeded`), no more.
 * With Node's default limit, evicted entries are garbage that V8 collects only when the old
 * space has grown to a few times what is live, and the bodies their Buffers hold outside the
 * heap wait with them: RSS after a fill was 3x `max_bytes` (issue 22).
 */
export function oldSpaceMib(config: Config): number {
  return Math.ceil(heapNeeded(config) / MIB);
}

/** The old-space size below which perch asks V8 to skip full collections (`INITIAL_OLD_SPACE_SHARE`). */
export function initialOldSpaceMib(config: Config): number {
  return Math.floor((config.cache.memory.max_bytes * INITIAL_OLD_SPACE_SHARE) / MIB);
}

/** What the user set of the flags perch would otherwise choose: theirs are left as they are. */
export interface UserHeapFlags {
  readonly semiSpace?: number | undefined;
  readonly initialOldSpace?: number | undefined;
}

/**
 * The node flags perch relaunches with: none of its own where the user set that flag (a flag the
 * user gives node itself comes after these and wins), and `WASM_BASELINE_FLAG` where node knows it.
 */
export function heapFlags(config: Config, user: UserHeapFlags = {}): string[] {
  return [
    `--max-old-space-size=${oldSpaceMib(config)}`,
    ...(user.semiSpace === undefined ? [`--max-semi-space-size=${SEMI_SPACE_MIB}`] : []),
    ...(user.initialOldSpace === undefined ? [`--initial-old-space-size=${initialOldSpaceMib(config)}`] : []),
    ...(knowsWasmBaselineFlag() ? [WASM_BASELINE_FLAG] : []),
  ];
}

/** What perch adds to the relaunched process's environment: nothing the user set is replaced. */
export function relaunchEnv(env: NodeJS.ProcessEnv): Record<string, string> {
  return env[MALLOC_ARENA_ENV] === undefined ? { [MALLOC_ARENA_ENV]: String(MALLOC_ARENAS) } : {};
}

/**
 * Whether to relaunch with `heapFlags` and `relaunchEnv`: not when this process is the
 * relaunched one, when the user set the old space (their choice wins; `heapShortfall` warns if it
 * is too small), or when `PERCH_HEAP_SIZING=off` asks for Node's own settings.
 */
export function heapPlan(config: Config, execArgv: readonly string[], env: NodeJS.ProcessEnv): HeapPlan {
  const user = userOldSpaceMib(execArgv, env.NODE_OPTIONS);
  // A flag given on the command line outranks NODE_OPTIONS: a semi-space or initial old space of
  // perch's own would silently override one the user set there.
  const userFlags: UserHeapFlags = {
    semiSpace: userSemiSpaceMib(execArgv, env.NODE_OPTIONS),
    initialOldSpace: userInitialOldSpaceMib(execArgv, env.NODE_OPTIONS),
  };
  if (env[HEAP_SIZED_ENV] === '1') {
    // The arena limit as glibc read it at this process's start: perch's, or the user's before it.
    const arenas = env[MALLOC_ARENA_ENV] ?? 'unset';
    return {
      kind: 'serve',
      settings: {
        set_by: 'perch',
        old_space_mib: user ?? oldSpaceMib(config),
        semi_space_mib: userFlags.semiSpace ?? SEMI_SPACE_MIB,
        initial_old_space_mib: userFlags.initialOldSpace ?? initialOldSpaceMib(config),
        malloc_arena_max: arenas,
        wasm_liftoff_only: liftoffOnly(execArgv),
      },
    };
  }
  if (user !== undefined) return { kind: 'serve', settings: { set_by: 'user', old_space_mib: user } };
  if (env[HEAP_SIZING_ENV] === 'off') return { kind: 'serve', settings: { set_by: 'node' } };
  return { kind: 'relaunch', flags: heapFlags(config, userFlags), env: relaunchEnv(env) };
}
