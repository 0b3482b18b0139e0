import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import { getHeapStatistics } from 'node:v8';
import { heapFlags, heapPlan, HEAP_SIZED_ENV, initialOldSpaceMib, oldSpaceMib, relaunchEnv, WASM_BASELINE_FLAG } from '../src/app/heap-size.js';
import { parseConfig } from '../src/config/load.js';
import { KEY, testConfig, v1, waitFor } from './helpers/perch.js';
import { tempDir } from './helpers/temp-dir.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

const MAIN = fileURLToPath(new URL('../src/main.js', import.meta.url));
/** perch's command (package.json's bin). */
const BIN = fileURLToPath(new URL('../../bin/perch', import.meta.url));
const DEMO_CONFIG = fileURLToPath(new URL('../../config/perch.yaml', import.meta.url));
const T = { timeout: 20_000 };

interface Started {
  readonly child: ChildProcess;
  readonly lines: () => Record<string, unknown>[];
  readonly exited: Promise<number | null>;
}

/**
 * perch on `config` (the demo's by default) at port 0 with `nodeArgs` and `env`, or through
 * `bin/perch` with `bin` (then no `nodeArgs`; the bin finds this node first on PATH); killed,
 * with any process below it, when the test ends.
 */
function startDemo(t: TestContext, nodeArgs: string[] = [], env: NodeJS.ProcessEnv = {}, { detached = false, config = DEMO_CONFIG, bin = false } = {}): Started {
  const [file, args] = bin ? [BIN, ['--config', config]] : [process.execPath, [...nodeArgs, MAIN, '--config', config]];
  const child = spawn(file, args, {
    env: { PATH: `${dirname(process.execPath)}:${process.env.PATH}`, PERCH_PORT: '0', ...env },
    stdio: ['ignore', 'pipe', 'ignore'],
    // The bin's own process group: were the shell ever to run node as its child rather than exec
    // it, a node left behind when the shell dies is still found and killed by its group.
    detached: detached || bin,
  });
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  onCleanup(t, () => {
    if (detached || bin) kill(-child.pid!, 'SIGKILL');
    for (const pid of [...childrenOf(child.pid!), child.pid!]) kill(pid, 'SIGKILL');
  });
  let stdout = '';
  child.stdout!.on('data', (d) => (stdout += d));
  const lines = () =>
    stdout
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  return { child, lines, exited };
}

function kill(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}

/** The node flags a running process was started with, from /proc (Linux). */
function flagsOf(pid: number): string[] {
  return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter((a) => a.startsWith('--max-') || a.startsWith('--initial-') || a === WASM_BASELINE_FLAG);
}

/** A variable of a running process's environment, as it was when the process started (Linux /proc). */
function envOf(pid: number, name: string): string | undefined {
  const entry = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').find((e) => e.startsWith(`${name}=`));
  return entry?.slice(name.length + 1);
}

/** The processes whose parent is `pid` (Linux /proc). */
function childrenOf(pid: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === pid) children.push(Number(entry));
    } catch {
      // exited while listing
    }
  }
  return children;
}

/** Running, and not a zombie left for whoever reaps it (an orphan's new parent, say). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

const listening = (s: Started) => waitFor(() => s.lines().some((l) => l.msg === 'perch listening'), 15_000);

test('the old space perch asks for is 0.85 x max_bytes + 64 MiB, with a 4 MiB semi-space, full collections skipped below 3/8 x max_bytes and WebAssembly on Liftoff', T, () => {
  const config = parseConfig(testConfig('main: { kind: fixture }', 'cache: { memory: { max_bytes: 134217728 } }'), {});
  // 0.85 x 128 + 64 = 172.8, rounded up; 3/8 x 128 = 48.
  assert.equal(oldSpaceMib(config), 173);
  assert.equal(initialOldSpaceMib(config), 48);
  assert.deepEqual(heapFlags(config), ['--max-old-space-size=173', '--max-semi-space-size=4', '--initial-old-space-size=48', '--liftoff-only']);
  assert.deepEqual(heapPlan(config, [], {}), { kind: 'relaunch', flags: heapFlags(config), env: { MALLOC_ARENA_MAX: '1' } });
  assert.deepEqual(heapPlan(config, heapFlags(config), { [HEAP_SIZED_ENV]: '1', MALLOC_ARENA_MAX: '1' }), {
    kind: 'serve',
    settings: { set_by: 'perch', old_space_mib: 173, semi_space_mib: 4, initial_old_space_mib: 48, malloc_arena_max: '1', wasm_liftoff_only: true },
  });
  // A --no-liftoff-only of the user's comes after perch's flags (relaunch.ts) and wins.
  const tiered = heapPlan(config, [...heapFlags(config), '--no-liftoff-only'], { [HEAP_SIZED_ENV]: '1', MALLOC_ARENA_MAX: '1' });
  assert.equal(tiered.kind === 'serve' && tiered.settings.set_by === 'perch' && tiered.settings.wasm_liftoff_only, false);
  assert.deepEqual(heapPlan(config, [], { NODE_OPTIONS: '--max-old-space-size=512' }), { kind: 'serve', settings: { set_by: 'user', old_space_mib: 512 } });
  assert.deepEqual(heapPlan(config, ['--max-old-space-size=100'], {}), { kind: 'serve', settings: { set_by: 'user', old_space_mib: 100 } });
  assert.deepEqual(heapPlan(config, [], { PERCH_HEAP_SIZING: 'off' }), { kind: 'serve', settings: { set_by: 'node' } });
  // A user's semi-space or initial old space, in NODE_OPTIONS or node's flags: perch sizes the
  // rest and leaves theirs be.
  const ownInitial = '--initial-old-space-size=48';
  assert.deepEqual(heapPlan(config, [], { NODE_OPTIONS: '--max-semi-space-size=16' }), { kind: 'relaunch', flags: ['--max-old-space-size=173', ownInitial, '--liftoff-only'], env: { MALLOC_ARENA_MAX: '1' } });
  assert.deepEqual(heapPlan(config, ['--max_semi_space_size=8'], {}), { kind: 'relaunch', flags: ['--max-old-space-size=173', ownInitial, '--liftoff-only'], env: { MALLOC_ARENA_MAX: '1' } });
  assert.deepEqual(heapPlan(config, ['--max-old-space-size=173', ownInitial], { [HEAP_SIZED_ENV]: '1', NODE_OPTIONS: '--max-semi-space-size=16', MALLOC_ARENA_MAX: '1' }), {
    kind: 'serve',
    settings: { set_by: 'perch', old_space_mib: 173, semi_space_mib: 16, initial_old_space_mib: 48, malloc_arena_max: '1', wasm_liftoff_only: false },
  });
  assert.deepEqual(heapPlan(config, [], { NODE_OPTIONS: '--initial-old-space-size=8' }), {
    kind: 'relaunch',
    flags: ['--max-old-space-size=173', '--max-semi-space-size=4', '--liftoff-only'],
    env: { MALLOC_ARENA_MAX: '1' },
  });
  assert.deepEqual(heapPlan(config, ['--initial_old_space_size=100'], {}), { kind: 'relaunch', flags: ['--max-old-space-size=173', '--max-semi-space-size=4', '--liftoff-only'], env: { MALLOC_ARENA_MAX: '1' } });
  assert.deepEqual(heapPlan(config, ['--max-old-space-size=173', '--max-semi-space-size=4', '--liftoff-only'], { [HEAP_SIZED_ENV]: '1', NODE_OPTIONS: '--initial-old-space-size=8', MALLOC_ARENA_MAX: '1' }), {
    kind: 'serve',
    settings: { set_by: 'perch', old_space_mib: 173, semi_space_mib: 4, initial_old_space_mib: 8, malloc_arena_max: '1', wasm_liftoff_only: true },
  });
});

test("perch relaunches with one glibc malloc arena, unless the environment sets MALLOC_ARENA_MAX: the user's value is kept and reported", T, () => {
  const config = parseConfig(testConfig('main: { kind: fixture }'), {});
  assert.deepEqual(relaunchEnv({}), { MALLOC_ARENA_MAX: '1' });
  assert.deepEqual(relaunchEnv({ MALLOC_ARENA_MAX: '4' }), {});
  assert.deepEqual(heapPlan(config, [], { MALLOC_ARENA_MAX: '4' }), { kind: 'relaunch', flags: heapFlags(config), env: {} });
  const relaunched = heapPlan(config, heapFlags(config), { [HEAP_SIZED_ENV]: '1', MALLOC_ARENA_MAX: '4' });
  assert.equal(relaunched.kind === 'serve' && relaunched.settings.set_by === 'perch' && relaunched.settings.malloc_arena_max, '4');
});

test('with nothing passed, perch runs with a heap sized from cache.memory.max_bytes and says so in its first log line', T, async (t) => {
  const perch = startDemo(t);
  await listening(perch);
  const first = perch.lines()[0]!;
  assert.match(String(first.msg), /^perch .* starting$/);
  assert.equal(first.node, process.version);
  // The demo's max_bytes is 64 MiB: 0.85 x 64 + 64 = 118.4, rounded up, and 3/8 x 64 = 24; V8's
  // limit adds three semi-spaces.
  assert.deepEqual(first.heap, { set_by: 'perch', old_space_mib: 119, semi_space_mib: 4, initial_old_space_mib: 24, malloc_arena_max: '1', wasm_liftoff_only: true, heap_limit_mib: 119 + 3 * 4 });
  const server = perch.child.pid!;
  assert.deepEqual(flagsOf(server), ['--max-old-space-size=119', '--max-semi-space-size=4', '--initial-old-space-size=24', '--liftoff-only']);
  assert.equal(envOf(server, 'MALLOC_ARENA_MAX'), '1');
  // One process: node replaced itself, no launcher stays.
  assert.equal(childrenOf(perch.child.pid!).length, 0);
  assert.equal(perch.lines().filter((l) => String(l.msg).endsWith(' starting')).length, 1);
  perch.child.kill('SIGTERM');
  assert.equal(await perch.exited, 0);
  assert.equal(alive(server), false);
});

test('through bin/perch, perch is the one process on every node: sized heap, one arena, its own PID, signals and exit status', T, async (t) => {
  const perch = startDemo(t, [], {}, { bin: true });
  await listening(perch);
  assert.deepEqual(perch.lines()[0]!.heap, { set_by: 'perch', old_space_mib: 119, semi_space_mib: 4, initial_old_space_mib: 24, malloc_arena_max: '1', wasm_liftoff_only: true, heap_limit_mib: 119 + 3 * 4 });
  const pid = perch.child.pid!;
  assert.deepEqual(flagsOf(pid), ['--max-old-space-size=119', '--max-semi-space-size=4', '--initial-old-space-size=24', '--liftoff-only']);
  assert.equal(readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0], process.execPath);
  assert.equal(envOf(pid, 'MALLOC_ARENA_MAX'), '1');
  assert.equal(childrenOf(pid).length, 0);
  perch.child.kill('SIGTERM');
  assert.equal(await perch.exited, 0);
  assert.equal(perch.lines().at(-1)!.msg, 'perch stopped');
});

test("through bin/perch, a user's NODE_OPTIONS heap wins, and a bad configuration is reported once with exit status 2", T, async (t) => {
  const perch = startDemo(t, [], { NODE_OPTIONS: '--max-old-space-size=300' }, { bin: true });
  await listening(perch);
  const heap = perch.lines()[0]!.heap as Record<string, unknown>;
  assert.deepEqual([heap.set_by, heap.old_space_mib], ['user', 300]);
  assert.deepEqual(flagsOf(perch.child.pid!), []);
  perch.child.kill('SIGTERM');
  assert.equal(await perch.exited, 0);

  const config = join(tempDir(t, 'perch-heap-'), 'perch.yaml');
  writeFileSync(config, 'server: { port: "eighty" }\n');
  const bad = spawn(BIN, ['--config', config], { env: { PATH: `${dirname(process.execPath)}:${process.env.PATH}` }, stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  onCleanup(t, () => kill(-bad.pid!, 'SIGKILL'));
  let stderr = '';
  bad.stderr.on('data', (d) => (stderr += d));
  const code = await new Promise<number | null>((resolve) => bad.on('exit', resolve));
  assert.equal(code, 2);
  assert.equal(stderr.split('is not a valid configuration').length, 2, stderr);
});

test("a user's own --max-old-space-size wins, in node's flags or NODE_OPTIONS: no relaunch", T, async (t) => {
  for (const [args, env] of [
    [['--max-old-space-size=300'], {}],
    [[], { NODE_OPTIONS: '--max-old-space-size=300' }],
  ] as const) {
    const perch = startDemo(t, [...args], env);
    await listening(perch);
    const heap = perch.lines()[0]!.heap as Record<string, unknown>;
    assert.deepEqual([heap.set_by, heap.old_space_mib], ['user', 300]);
    assert.deepEqual(flagsOf(perch.child.pid!), [...args]);
    assert.equal(childrenOf(perch.child.pid!).length, 0);
    perch.child.kill('SIGTERM');
    assert.equal(await perch.exited, 0);
  }
});

test("a user's own --max-semi-space-size in NODE_OPTIONS and MALLOC_ARENA_MAX win over perch's: perch sizes the rest and leaves them be", T, async (t) => {
  const perch = startDemo(t, [], { NODE_OPTIONS: '--max-semi-space-size=16', MALLOC_ARENA_MAX: '4' });
  await listening(perch);
  assert.deepEqual(perch.lines()[0]!.heap, { set_by: 'perch', old_space_mib: 119, semi_space_mib: 16, initial_old_space_mib: 24, malloc_arena_max: '4', wasm_liftoff_only: true, heap_limit_mib: 119 + 3 * 16 });
  const server = perch.child.pid!;
  assert.deepEqual(flagsOf(server), ['--max-old-space-size=119', '--initial-old-space-size=24', '--liftoff-only']);
  assert.equal(envOf(server, 'MALLOC_ARENA_MAX'), '4');
  perch.child.kill('SIGTERM');
  assert.equal(await perch.exited, 0);
});

test("PERCH_HEAP_SIZING=off keeps node's own heap limit and glibc's arenas", T, async (t) => {
  const perch = startDemo(t, [], { PERCH_HEAP_SIZING: 'off' });
  await listening(perch);
  assert.deepEqual(perch.lines()[0]!.heap, { set_by: 'node', heap_limit_mib: Math.floor(getHeapStatistics().heap_size_limit / 2 ** 20) });
  assert.equal(childrenOf(perch.child.pid!).length, 0);
  assert.equal(envOf(perch.child.pid!, 'MALLOC_ARENA_MAX'), undefined);
  perch.child.kill('SIGTERM');
  assert.equal(await perch.exited, 0);
});

test("a terminal's Ctrl-C (SIGINT to the process group) stops perch once: the request in flight is answered", T, async (t) => {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  const upstream = await startUpstream(t, (req, res) => void held.then(() => sampleProvider(req, res)));
  const config = join(tempDir(t, 'perch-heap-'), 'perch.yaml');
  writeFileSync(config, testConfig(v1('main', upstream.url)));
  const perch = startDemo(t, [], {}, { detached: true, config });
  await listening(perch);
  const address = String(perch.lines().find((l) => l.msg === 'perch listening')!.address);
  const answer = fetch(`${address}/v1/users/1`, { headers: { 'x-api-key': KEY } });
  await waitFor(() => upstream.requests.length === 1);
  process.kill(-perch.child.pid!, 'SIGINT');
  await waitFor(() => perch.lines().some((l) => l.msg === 'perch stopping: draining in-flight requests'));
  // A second SIGINT would exit at once, without this answer.
  release();
  assert.equal((await answer).status, 200);
  assert.equal(await perch.exited, 0);
  const messages = perch.lines().map((l) => l.msg);
  assert.equal(messages.filter((m) => m === 'perch stopping: draining in-flight requests').length, 1);
  assert.equal(messages.includes('second stop signal: exiting without waiting for requests'), false);
});

