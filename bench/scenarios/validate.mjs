// Response check: what perch's schema check of an upstream 2xx body (src/schemas/response-check.ts)
// adds to the miss path, per ~10 KB page. In process, no servers: the check is pure CPU, and a
// sub-10 µs cost is far below the noise of a loopback latency measurement, so it is timed directly.
// It replaced an envelope check of a few property reads, so its own cost is the cost it adds.
//
// Each round validates pre-parsed copies of the page in rotation (distinct objects, as each miss
// parses its own, so the walk is not served from one hot copy), and reports microseconds per body;
// the figure is the median of 5 rounds after a warm-up. Decoding and parsing the same bytes, which
// the miss path already paid before the check existed, is the baseline for scale.
//
// Also runnable alone: `npm run validate` (from bench/) prints the figures.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { bodyFactory, followingPage } from '../lib/bodies.mjs';
import { ensureBuilt } from '../lib/perch.mjs';
import { median } from '../lib/stats.mjs';

const ROUNDS = 5;
const COPIES = 64;
const WARMUP_ITERATIONS = 20_000;
const TARGET_US = 50;
/** Rounds of about 0.1 s at ~1 µs per body (parse rounds take a tenth of the iterations). */
const ITERATIONS = 100_000;

export async function validateScenario(ctx) {
  const module = join(ctx.repoRoot, 'dist', 'src', 'schemas', 'response-check.js');
  if (!existsSync(module)) {
    const unavailable = 'this build has no dist/src/schemas/response-check.js';
    return { figures: [{ id: 'validate.tweets', label: 'response check, ~10 KB tweets page (µs per body)', unavailable }], notes: [] };
  }
  const { checkResponseBody } = await import(pathToFileURL(module).href);
  const bodies = bodyFactory();
  const pages = [
    { id: 'tweets', endpoint: 'tweets', bytes: bodies.tweets('1234567890123456789') },
    { id: 'following', endpoint: 'following', bytes: followingPage(10_240) },
  ];
  const figures = [];
  const notes = [];
  for (const page of pages) {
    const copies = Array.from({ length: COPIES }, () => JSON.parse(page.bytes.toString('utf8')));
    const invalid = checkResponseBody(page.endpoint, copies[0]);
    if (invalid !== undefined) throw new Error(`the bench's ${page.id} page fails the check: ${invalid}`);
    const check = (i) => checkResponseBody(page.endpoint, copies[i % COPIES]) === undefined;
    // As the miss path does it: decode the bytes, then parse.
    const parse = () => typeof JSON.parse(page.bytes.toString('utf8')) === 'object';
    timeRound(check, WARMUP_ITERATIONS);
    timeRound(parse, WARMUP_ITERATIONS / 10);
    const checkRuns = [];
    const parseRuns = [];
    for (let r = 0; r < ROUNDS; r++) {
      checkRuns.push(timeRound(check, ITERATIONS));
      parseRuns.push(timeRound(parse, ITERATIONS / 10));
    }
    figures.push({
      id: `validate.${page.id}`,
      label: `response check, ${(page.bytes.length / 1024).toFixed(1)} KB ${page.id} page (µs per body)`,
      runs: checkRuns,
      baseline: { label: 'decode + JSON.parse of it', runs: parseRuns },
      decimals: 2,
      target: { text: `<= ${TARGET_US} µs`, pass: (v) => v <= TARGET_US },
    });
    notes.push(
      `Response check, ${page.id} page of ${page.bytes.length} bytes: median ${median(checkRuns).toFixed(2)} µs per body over ${ROUNDS} rounds of ${ITERATIONS} (${COPIES} parsed copies in rotation), decoding and JSON.parse of the same bytes ${median(parseRuns).toFixed(1)} µs.`,
    );
  }
  return { figures, notes };
}

/** Microseconds per call of `fn(i)` over `iterations` calls; a call returning false aborts the bench. */
function timeRound(fn, iterations) {
  let failures = 0;
  const started = process.hrtime.bigint();
  for (let i = 0; i < iterations; i++) if (fn(i) === false) failures++;
  const elapsedNs = Number(process.hrtime.bigint() - started);
  if (failures > 0) throw new Error(`${failures} calls failed`);
  return elapsedNs / 1000 / iterations;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const repoRoot = process.env.BENCH_PERCH_ROOT ?? dirname(dirname(dirname(fileURLToPath(import.meta.url))));
  ensureBuilt(repoRoot, join(repoRoot, 'dist', 'src', 'main.js'));
  const { figures, notes } = await validateScenario({ repoRoot });
  for (const f of figures) {
    if (f.unavailable) process.stdout.write(`${f.label}: not available: ${f.unavailable}\n`);
    else process.stdout.write(`${f.label}: median ${median(f.runs).toFixed(2)} (rounds ${f.runs.map((v) => v.toFixed(2)).join(' / ')}), target ${f.target.text}\n`);
  }
  for (const n of notes) process.stdout.write(`- ${n}\n`);
}
