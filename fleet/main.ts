import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { connectionOwner, drawShape, startFleet, Teardown, type Instance } from './fleet.js';
import { HistoryWriter, readHistory, split, type Event, type History } from './history.js';
import { checkAll, INVARIANTS, type Violation } from './invariants.js';
import { Prng } from './prng.js';
import { startV1Provider, startXProvider } from './provider.js';
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
    // Calls are told apart by the instance that made them once the fleet is up.
    let instances: readonly Instance[] = [];
    const caller = (clientPort: number, serverPort: number) => connectionOwner(instances, clientPort, serverPort);
    const provider = await startV1Provider(now, (c) => history.add(c), shape.run.passThrough, caller);
    teardown.context.after(() => provider.close());
    const x = shape.run.batch ? await startXProvider(now, (c) => history.add(c), caller) : undefined;
    if (x !== undefined) teardown.context.after(() => x.close());
    const fleet = await startFleet(teardown, shape, dir, options.perch, provider.url, x?.url, history, now);
    instances = fleet.instances;
    await workload({ shape, fleet, provider, x, history, now, endsAt: now() + options.seconds * 1000 }, prng.fork());
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

async function cli(): Promise<number> {
  const { values } = parseArgs({
    options: {
      seed: { type: 'string' },
      seconds: { type: 'string', default: '60' },
      instances: { type: 'string', default: '3' },
      perch: { type: 'string', default: ROOT },
      'known-open': { type: 'string', default: 'report' },
      out: { type: 'string' },
      check: { type: 'string' },
    },
  });
  const knownOpen = values['known-open'] === 'fail' ? 'fail' : 'report';
  let seed: number;
  let violations: readonly Violation[];
  let where: string;
  let requests: number;
  let calls: number;
  if (values.check !== undefined) {
    const h = split(readHistory(values.check));
    seed = h.run.seed;
    violations = checkAll(h);
    where = values.check;
    requests = h.requests.length;
    calls = h.calls.length;
  } else {
    seed = values.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : Number(values.seed);
    const options: FleetOptions = { seed, seconds: Number(values.seconds), instances: Number(values.instances), perch: resolve(values.perch), ...(values.out === undefined ? {} : { out: resolve(values.out) }) };
    console.log(`fleet: seed ${seed}, ${options.seconds} s, ${options.instances} instances, perch ${options.perch}`);
    const started = performance.now();
    const result = await runFleet(options);
    violations = result.violations;
    where = result.historyPath;
    requests = result.history.requests.length;
    calls = result.history.calls.length;
    const r = result.history.run;
    console.log(`fleet: ${((performance.now() - started) / 1000).toFixed(1)} s; workers ${r.workers}, pass-through ${r.passThrough}, batch ${r.batch}, ttl ${r.ttl}, stale ${r.staleSeconds}`);
    if (violations.length === 0 && values.out === undefined) rmSync(resolve(where, '..'), { recursive: true, force: true });
  }
  console.log(`fleet: ${requests} requests, ${calls} provider calls, ${INVARIANTS.length} invariants checked`);
  for (const v of violations) console.log(describe(v, seed));
  const fails = failing(violations, knownOpen);
  if (violations.length > 0) console.log(`fleet: history in ${where}; replay: npm run fleet -- --seed ${seed}`);
  console.log(`fleet: seed ${seed}: ${fails.length === 0 ? 'pass' : 'FAIL'} (${violations.length} violations, ${violations.length - fails.length} of open issues or advisory, reported only)`);
  return fails.length === 0 ? 0 : 1;
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  cli().then(
    (code) => process.exit(code),
    (error: unknown) => {
      console.error(error);
      process.exit(2);
    },
  );
}
