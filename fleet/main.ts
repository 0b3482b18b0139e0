import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { drawShape, startFleet, Teardown } from './fleet.js';
import { HistoryWriter, readHistory, split, type Event, type History } from './history.js';
import { checkAll, INVARIANTS, type Violation } from './invariants.js';
import { Prng } from './prng.js';
import { socketOwner, startV1Provider, startXProvider, type Owner } from './provider.js';
import { workload } from './workload.js';

export interface FleetOptions {
  readonly seed: number;
  readonly seconds: number;
  readonly instances: number;
  /** The perch checkout whose `dist/src/main.js` runs. */
  readonly perch: string;
  /** Where the history goes; a temporary directory (removed when nothing failed) by default. */
  readonly out?: string;
}

export interface FleetResult {
  readonly history: History;
  readonly historyPath: string;
  readonly violations: readonly Violation[];
}

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));

/** Starts a fleet drawn from the seed, drives it for `seconds`, and checks the history. */
export async function runFleet(options: FleetOptions): Promise<FleetResult> {
  const dir = options.out ?? mkdtempSync(join(tmpdir(), 'perch-fleet-'));
  mkdirSync(dir, { recursive: true });
  const historyPath = join(dir, `fleet-${options.seed}.jsonl`);
  const history = new HistoryWriter(historyPath);
  const t0 = performance.now();
  const now = () => performance.now() - t0;
  const prng = new Prng(options.seed);
  const shape = drawShape(prng.fork(), options.seed, options.instances, options.perch);
  history.add(shape.run);
  const teardown = new Teardown();
  // Interrupted, the fleet still stops what it started: perch processes, Redis, servers.
  const interrupted = (signal: NodeJS.Signals) => void teardown.run().finally(() => process.exit(signal === 'SIGINT' ? 130 : 143));
  process.once('SIGINT', interrupted);
  process.once('SIGTERM', interrupted);
  try {
    const provider = await startV1Provider(now, (c) => history.add(c), shape.run.passThrough);
    teardown.context.after(() => provider.close());
    const x = shape.run.batch ? await startXProvider(now, (c) => history.add(c)) : undefined;
    if (x !== undefined) teardown.context.after(() => x.close());
    const fleet = await startFleet(teardown, shape, dir, options.perch, provider.url, x?.url, history, now);
    const owner: Owner = (client, server) => socketOwner(client, server, new Map(fleet.instances.flatMap((inst) => (inst.child?.pid === undefined ? [] : [[inst.child.pid, inst.index] as const]))));
    provider.owner = owner;
    if (x !== undefined) x.owner = owner;
    await workload({ shape, fleet, provider, x, history, now, endsAt: now() + options.seconds * 1000 }, prng.fork());
    // Counters are read once nothing is in flight (a background refresh may still be), before the end.
    await Promise.all([provider.quiet(300), x?.quiet(300)]);
    for (const inst of fleet.instances) await inst.scrape();
    // The end: every instance drains on SIGTERM, so its log must be whole.
    await Promise.all(fleet.instances.map((inst) => inst.stop('SIGTERM')));
  } finally {
    process.off('SIGINT', interrupted);
    process.off('SIGTERM', interrupted);
    await teardown.run();
  }
  const h = split(history.events);
  return { history: h, historyPath, violations: checkAll(h) };
}

/** The shortest slice that shows a violation, one event a line. */
export function describe(v: Violation, seed: number): string {
  const tag = v.openIssue !== undefined ? ` [open issue ${v.openIssue}]` : v.advisory === true ? ' [advisory]' : '';
  const lines = v.slice.slice(0, 20).map((e: Event) => `    ${JSON.stringify(e)}`);
  return [`seed ${seed}: ${v.invariant}${tag}: ${v.message}`, ...lines, ...(v.slice.length > 20 ? [`    ... ${v.slice.length - 20} more`] : [])].join('\n');
}

/** The violations that fail the run: untagged ones always, open-issue and advisory ones with `knownOpen: fail`. */
export function failing(violations: readonly Violation[], knownOpen: 'report' | 'fail'): Violation[] {
  return violations.filter((v) => (v.openIssue === undefined && v.advisory === undefined) || knownOpen === 'fail');
}

/** More would fork that many perch processes and Redis relays on one machine: a typo, not a fleet. */
const MAX_INSTANCES = 64;

export const USAGE = `usage: npm run fleet -- [options]   (or node dist/fleet/main.js [options])
Starts perch processes drawn from a seed, drives them with faults, and checks the history.

  --seed N            the seed, a whole number from 0 to 4294967295 (default: a random one)
  --seconds S         how long the workload runs, in seconds, more than 0 (default 60)
  --instances K       how many perch processes, 1 to ${MAX_INSTANCES} (default 3)
  --perch DIR         the perch checkout whose dist/src/main.js runs (default: this one)
  --out DIR           keep the history (fleet-<seed>.jsonl) in DIR
  --known-open MODE   report (default): open issues' and advisory violations are printed only;
                      fail: they fail the run too
  --check FILE        check a recorded history again instead of running a fleet
  -h, --help          print this text

Exit status: 0 nothing failed, 1 a violation failed the run, 2 bad usage or an error.`;

/** What the command line asks for. */
export type FleetCommand =
  | { readonly kind: 'help' }
  | { readonly kind: 'check'; readonly path: string; readonly knownOpen: 'report' | 'fail' }
  | { readonly kind: 'run'; readonly options: FleetOptions; readonly knownOpen: 'report' | 'fail' };

/** A command line that asks for nothing this checker does: the message says what was wrong. */
export class UsageError extends Error {}

/** Reads the command line; throws a UsageError on an unknown option or a bad value, before anything starts. */
export function parseCommand(args: readonly string[]): FleetCommand {
  let values;
  try {
    ({ values } = parseArgs({
      args: [...args],
      options: {
        help: { type: 'boolean', short: 'h' },
        seed: { type: 'string' },
        seconds: { type: 'string' },
        instances: { type: 'string' },
        perch: { type: 'string' },
        'known-open': { type: 'string' },
        out: { type: 'string' },
        check: { type: 'string' },
      },
    }));
  } catch (error) {
    // Its first line: the rest is advice on quoting that the usage gives better.
    if (error instanceof Error && String((error as { code?: unknown }).code).startsWith('ERR_PARSE_ARGS_')) throw new UsageError(error.message.split('\n')[0]!);
    throw error;
  }
  if (values.help === true) return { kind: 'help' };
  const knownOpen = values['known-open'] ?? 'report';
  if (knownOpen !== 'report' && knownOpen !== 'fail') throw new UsageError(`--known-open takes report or fail, not ${JSON.stringify(knownOpen)}`);
  if (values.check !== undefined) {
    const runOnly = (['seed', 'seconds', 'instances', 'perch', 'out'] as const).filter((name) => values[name] !== undefined);
    if (runOnly.length > 0) throw new UsageError(`--check reads a recorded history: ${runOnly.map((name) => `--${name}`).join(', ')} would run a fleet`);
    if (!existsSync(values.check)) throw new UsageError(`--check: no such file: ${values.check}`);
    return { kind: 'check', path: values.check, knownOpen };
  }
  const seed = values.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : whole('--seed', values.seed, 0, 2 ** 32 - 1);
  const seconds = values.seconds === undefined ? 60 : Number(values.seconds);
  if (values.seconds !== undefined && !(/^\d+(\.\d+)?$/.test(values.seconds) && seconds > 0)) throw new UsageError(`--seconds takes a number of seconds more than 0, not ${JSON.stringify(values.seconds)}`);
  const instances = values.instances === undefined ? 3 : whole('--instances', values.instances, 1, MAX_INSTANCES);
  const perch = resolve(values.perch ?? ROOT);
  if (!existsSync(join(perch, 'dist', 'src', 'main.js'))) throw new UsageError(`--perch: no dist/src/main.js under ${perch} (build that checkout first)`);
  return { kind: 'run', options: { seed, seconds, instances, perch, ...(values.out === undefined ? {} : { out: resolve(values.out) }) }, knownOpen };
}

/** `text` as a whole number from `min` to `max`, or a UsageError naming `option`. */
function whole(option: string, text: string, min: number, max: number): number {
  const n = Number(text);
  if (!/^\d+$/.test(text) || n < min || n > max) throw new UsageError(`${option} takes a whole number from ${min} to ${max}, not ${JSON.stringify(text)}`);
  return n;
}

async function cli(args: readonly string[]): Promise<number> {
  let command: FleetCommand;
  try {
    command = parseCommand(args);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    console.error(`fleet: ${error.message}`);
    console.error(USAGE);
    return 2;
  }
  if (command.kind === 'help') {
    console.log(USAGE);
    return 0;
  }
  let seed: number;
  let violations: readonly Violation[];
  let where: string;
  let requests: number;
  let calls: number;
  if (command.kind === 'check') {
    let h: History;
    try {
      h = split(readHistory(command.path));
    } catch (error) {
      // Not a history this checker wrote (or one cut short): a line, not a stack trace.
      console.error(`fleet: cannot check ${command.path}: ${error instanceof Error ? error.message : String(error)}`);
      return 2;
    }
    seed = h.run.seed;
    violations = checkAll(h);
    where = command.path;
    requests = h.requests.length;
    calls = h.calls.length;
  } else {
    const { options } = command;
    seed = options.seed;
    console.log(`fleet: seed ${seed}, ${options.seconds} s, ${options.instances} instances, perch ${options.perch}`);
    const started = performance.now();
    const result = await runFleet(options);
    violations = result.violations;
    where = result.historyPath;
    requests = result.history.requests.length;
    calls = result.history.calls.length;
    const r = result.history.run;
    console.log(`fleet: ${((performance.now() - started) / 1000).toFixed(1)} s; workers ${r.workers}, pass-through ${r.passThrough}, batch ${r.batch}, ttl ${r.ttl}, stale ${r.staleSeconds}`);
    if (violations.length === 0 && options.out === undefined) rmSync(resolve(where, '..'), { recursive: true, force: true });
  }
  console.log(`fleet: ${requests} requests, ${calls} provider calls, ${INVARIANTS.length} invariants checked`);
  for (const v of violations) console.log(describe(v, seed));
  const fails = failing(violations, command.knownOpen);
  if (violations.length > 0) console.log(`fleet: history in ${where}; replay: npm run fleet -- --seed ${seed}`);
  console.log(`fleet: seed ${seed}: ${fails.length === 0 ? 'pass' : 'FAIL'} (${violations.length} violations, ${violations.length - fails.length} of open issues or advisory, reported only)`);
  return fails.length === 0 ? 0 : 1;
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  cli(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (error: unknown) => {
      console.error(error);
      process.exit(2);
    },
  );
}
