#!/usr/bin/env node
// perch benchmarks (issue #6): `npm run bench` from bench/. Runs every scenario, prints a table,
// writes bench/RESULTS.md. Environment:
//   BENCH_DURATION_S (10)        seconds per measured miss run (and hit run, unless the next is set)
//   BENCH_HIT_DURATION_S (5)     seconds per measured hit run: the hit path runs the ceiling before
//                                every other target (paired), twice the runs, so shorter ones
//   BENCH_RUNS (3)               interleaved rounds per figure, at least 3 (median reported)
//   BENCH_WARMUP_S (2)           warm-up run per target before measuring (capped at the duration)
//   BENCH_CONNECTIONS (64)       hit-path connections, also the cache-fill concurrency
//   BENCH_MISS_CONNECTIONS (1)   miss-path connections (see scenarios/miss.mjs)
//   BENCH_MISS_COMPRESSION       YAML for the miss perch's cache.compression, e.g. '{ brotli: false, gzip: false }'
//   BENCH_ONLY                   comma list of scenarios: hit,hit-side,hit-tail,hit-rate,bytes,miss,economy,memory,redis-frozen,validate,quota,sick-upstream,fairness,batch,tracing
//   BENCH_ECONOMY_REQUESTS (100000), BENCH_ECONOMY_KEYS (10000), BENCH_ZIPF_S (1.1), BENCH_SEED (6)
//   BENCH_MEMORY_PAGES (120000), BENCH_MEMORY_MAX_BYTES (67108864), BENCH_MEMORY_CONNECTIONS (32),
//   BENCH_MEMORY_NODES (comma list of node executables; default this one)
//   BENCH_SERVER_CPU (0), BENCH_CLIENT_CPU (1)
//   BENCH_LOG_FILE=0             perch logs to /dev/null instead of a file in the temp dir (diagnosis
//                                only: production writes its log, and the figures say which it was)
//   BENCH_RESULTS                output file (bench/RESULTS.md)
//   BENCH_PERCH_ROOT             perch checkout to measure (default: the repository around bench/)
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureBuilt, metricsSection } from './lib/perch.mjs';
import { installCleanup, pinning, pinSelf } from './lib/procs.mjs';
import { nginxVersion } from './lib/nginx.mjs';
import { evaluate, printTables, writeResults } from './lib/report.mjs';
import { varnishVersion } from './lib/varnish.mjs';
import { wrkVersion } from './lib/wrk.mjs';
import { batchScenario } from './scenarios/batch.mjs';
import { bytesScenario } from './scenarios/bytes.mjs';
import { economyScenario } from './scenarios/economy.mjs';
import { fairnessScenario } from './scenarios/fairness.mjs';
import { hitScenario } from './scenarios/hit.mjs';
import { hitRateScenario } from './scenarios/hit-rate.mjs';
import { hitSideScenario } from './scenarios/hit-side.mjs';
import { hitTailScenario } from './scenarios/hit-tail.mjs';
import { memoryScenario } from './scenarios/memory.mjs';
import { missScenario } from './scenarios/miss.mjs';
import { quotaScenario } from './scenarios/quota.mjs';
import { redisFrozenScenario } from './scenarios/redis-frozen.mjs';
import { sickUpstreamScenario } from './scenarios/sick-upstream.mjs';
import { tracingScenario } from './scenarios/tracing.mjs';
import { validateScenario } from './scenarios/validate.mjs';
import { perchRoot } from './lib/standalone.mjs';

const benchDir = dirname(fileURLToPath(import.meta.url));
const repoRoot = perchRoot();

function num(name, fallback, { min = 0, integer = false } = {}) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < min || (integer && !Number.isInteger(value))) {
    throw new Error(`${name} must be ${integer ? 'an integer' : 'a number'} >= ${min}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

const SCENARIOS = {
  hit: hitScenario,
  'hit-side': hitSideScenario,
  'hit-tail': hitTailScenario,
  'hit-rate': hitRateScenario,
  bytes: bytesScenario,
  miss: missScenario,
  economy: economyScenario,
  memory: memoryScenario,
  'redis-frozen': redisFrozenScenario,
  validate: validateScenario,
  quota: quotaScenario,
  'sick-upstream': sickUpstreamScenario,
  fairness: fairnessScenario,
  batch: batchScenario,
  tracing: tracingScenario,
};

/** The scenarios whose figures wrk measures (hit-rate: its saturated rate). */
const LOAD_GENERATED = ['hit', 'hit-side', 'hit-tail', 'hit-rate', 'bytes', 'miss', 'redis-frozen', 'tracing'];

function readOptions() {
  const durationS = num('BENCH_DURATION_S', 10, { min: 1 });
  const only = (process.env.BENCH_ONLY ?? '').split(',').map((s) => s.trim()).filter(Boolean);
  for (const name of only) if (!(name in SCENARIOS)) throw new Error(`BENCH_ONLY: unknown scenario ${name} (known: ${Object.keys(SCENARIOS).join(', ')})`);
  return {
    durationS,
    hitDurationS: num('BENCH_HIT_DURATION_S', process.env.BENCH_DURATION_S === undefined ? 5 : durationS, { min: 1 }),
    runs: num('BENCH_RUNS', 3, { min: 3, integer: true }),
    warmupS: Math.min(durationS, num('BENCH_WARMUP_S', 2, { min: 1 })),
    connections: num('BENCH_CONNECTIONS', 64, { min: 1, integer: true }),
    missConnections: num('BENCH_MISS_CONNECTIONS', 1, { min: 1, integer: true }),
    only: only.length > 0 ? only : Object.keys(SCENARIOS),
    serverCpu: num('BENCH_SERVER_CPU', 0, { integer: true }),
    clientCpu: num('BENCH_CLIENT_CPU', 1, { integer: true }),
    logToFile: process.env.BENCH_LOG_FILE !== '0',
    results: process.env.BENCH_RESULTS ?? join(benchDir, 'RESULTS.md'),
    economy: {
      requests: num('BENCH_ECONOMY_REQUESTS', 100_000, { min: 1, integer: true }),
      keys: num('BENCH_ECONOMY_KEYS', 10_000, { min: 1, integer: true }),
      s: num('BENCH_ZIPF_S', 1.1, { min: 0 }),
      seed: num('BENCH_SEED', 6, { integer: true }),
      concurrency: num('BENCH_CONNECTIONS', 64, { min: 1, integer: true }),
      deadlineS: 120,
    },
    memory: {
      pages: num('BENCH_MEMORY_PAGES', 120_000, { min: 1, integer: true }),
      maxBytes: num('BENCH_MEMORY_MAX_BYTES', 64 * 1024 * 1024, { min: 1024 * 1024, integer: true }),
      connections: num('BENCH_MEMORY_CONNECTIONS', 32, { min: 1, integer: true }),
      deadlineS: 1200,
    },
  };
}

function gitDescription() {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: repoRoot, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'src'], { cwd: repoRoot, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() !== '';
    return `${head}${dirty ? ' (src/ has uncommitted changes)' : ''}`;
  } catch {
    return `not a git checkout: ${repoRoot}`;
  }
}

async function main() {
  const options = readOptions();
  const wrkLine = wrkVersion();
  if (wrkLine === null && options.only.some((name) => LOAD_GENERATED.includes(name))) {
    throw new Error('wrk is not on PATH: run `npm run setup` in bench/ (installs wrk, nginx and varnish with apt)');
  }
  installCleanup();
  const perchMain = join(repoRoot, 'dist', 'src', 'main.js');
  const built = ensureBuilt(repoRoot, perchMain);
  const pin = pinning(options);
  pinSelf(pin.clientCpu);
  const tmpDir = mkdtempSync(join(os.tmpdir(), 'perch-bench-'));
  process.on('exit', () => rmSync(tmpDir, { recursive: true, force: true }));
  const started = Date.now();
  const log = (line) => process.stderr.write(`${line}\n`);
  const ctx = { options, pin, tmpDir, repoRoot, perchMain, log, metricsYaml: undefined, metricsPresent: undefined };
  ctx.metricsYaml = metricsSection(ctx);

  log(`bench: ${options.only.join(', ')}; ${options.durationS} s x ${options.runs} runs; ${pin.note}`);
  const figures = [];
  const tables = [];
  const notes = [];
  const errors = [];
  for (const name of options.only) {
    log(`bench: ${name}`);
    const t0 = Date.now();
    try {
      const result = await SCENARIOS[name](ctx);
      figures.push(...result.figures.map(evaluate));
      tables.push(...(result.tables ?? []));
      notes.push(...result.notes);
    } catch (error) {
      errors.push(`${name}: ${error.message}`);
      log(`bench: ${name} failed: ${error.stack ?? error.message}`);
    }
    log(`bench: ${name} took ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  }

  const cpus = os.cpus();
  const smoke = options.durationS < 10;
  const env = [
    ['date', new Date().toISOString()],
    ['node', process.version],
    ['CPU cores', `${cpus.length} x ${cpus[0]?.model ?? 'unknown'}`],
    ['OS', `${os.type()} ${os.release()} ${os.arch()}`],
    ['perch', `${gitDescription()}${built ? ', built by the bench' : ''}`],
    ['pinning', pin.note],
    ['rounds', `${options.runs} interleaved rounds x ${options.durationS} s per target (hit path: ${options.hitDurationS} s, each run paired with a ceiling run just before it, order rotated each round), after a ${options.warmupS} s warm-up run per target${smoke ? ' — SMOKE' : ''}`],
    ['load generator', `${wrkLine ?? 'wrk not found'}, 1 thread; an open-loop fixed-rate generator (lib/open-loop.mjs, Node, own process) for hit-rate; an undici loop for fixed request lists`],
    ['hit-path peers', `${nginxVersion() ?? 'nginx not found'}; ${varnishVersion() ?? 'varnishd not found'}`],
    ['hit connections', String(options.connections)],
    ['miss connections', String(options.missConnections)],
    ['perch log', options.logToFile ? 'level info, access log to a file in the temp dir' : 'level info, access log to /dev/null (BENCH_LOG_FILE=0: not as production runs)'],
    ['metrics', ctx.metricsPresent === undefined ? `config ${ctx.metricsYaml ?? '(none accepted)'}` : `${ctx.metricsPresent ? 'endpoint present' : 'no /metrics endpoint in this build'} (config \`${ctx.metricsYaml ?? 'none'}\`)`],
    ['total time', `${((Date.now() - started) / 1000).toFixed(0)} s`],
  ];
  const table = printTables(figures, tables);
  process.stdout.write(`\n${table}\n`);
  if (errors.length > 0) process.stdout.write(`\nfailed scenarios:\n${errors.map((e) => `  ${e}`).join('\n')}\n`);
  writeResults(options.results, { env, settings: { ...options, smoke }, figures, tables, notes, errors });
  process.stdout.write(`\nwrote ${options.results}\n`);
  process.exitCode = errors.length > 0 ? 1 : 0;
}

main().catch((error) => {
  process.stderr.write(`bench: ${error.stack ?? error.message}\n`);
  process.exitCode = 1;
});
