// The results tables (console) and bench/RESULTS.md, with the rule that makes a figure INVALID.
import { writeFileSync } from 'node:fs';
import { median } from './stats.mjs';

/**
 * A load-generated figure only measures the server when the generator had CPU to spare and the
 * server had none: above GENERATOR_MAX of its core the generator may be what limits the rate;
 * below SERVER_MIN of its own core (throughput figures only) the server was waiting on something,
 * or something else was using its core. Latency figures (one connection on the miss path, the
 * bounds under a frozen Redis) do not saturate the server, so for them only the generator rule
 * applies.
 */
export const GENERATOR_MAX = 0.85;
export const SERVER_MIN = 0.9;
/**
 * Latency figures are not INVALID for it, but flagged noisy when other processes used more than
 * this share of the server's or the generator's core: queueing behind them is in the latencies.
 */
export const OTHERS_MAX = 0.1;
/**
 * An open-loop run (open-loop.mjs) measures latency at the rate it asked for only when it sent
 * that many requests and had that many answered: further off than this (a fraction of the rate)
 * the generator fell behind or the server did not keep up, and the figure is INVALID.
 */
export const RATE_TOLERANCE = 0.01;
/**
 * Side by side (shared-core.mjs), each side must have had between this and 1 minus this of the
 * two servers' CPU: with Linux's autogroup scheduling a process in a session of its own (perch
 * relaunched to size its heap) and one in the bench's session split the core 0.2-0.3 to 0.7-0.8
 * here, and the rates then compare shares, not costs.
 */
export const SPLIT_MIN = 0.45;

/**
 * What a figure was measured on, for the INVALID rule: `name`, the per-run CPU shares of the
 * generator and the server side, how busy their cores were (to tell "the server was waiting" from
 * "other processes took its core"), the failed requests (status >= 400, socket errors) and, for
 * open-loop runs, how far the achieved rate was from the requested one.
 */
export function side(name, runs) {
  return {
    name,
    generator: runs.map((r) => r.generatorCpu),
    server: runs.map((r) => r.serverCpu),
    serverCore: runs.map((r) => r.serverCoreBusy),
    generatorCore: runs.map((r) => r.generatorCoreBusy),
    failed: runs.reduce((n, r) => n + r.errorStatuses + r.socketErrors, 0),
    // Side-by-side runs only (shared-core.mjs): both sides' shares of the one client core and of
    // the one server core.
    pairGenerator: runs.map((r) => r.pairGeneratorCpu),
    pairServer: runs.map((r) => r.pairServerCpu),
    // Open-loop runs only: how far each run's sent and answered rates were from the requested one.
    rateOff: runs.map((r) => (r.requestedRate === undefined ? 0 : Math.max(Math.abs(r.sentRate / r.requestedRate - 1), Math.abs(r.rps / r.requestedRate - 1)))),
  };
}

/** Why the runs of `sides` do not measure what they claim (empty when they do). */
export function invalidReasons(sides, rule) {
  const reasons = [];
  for (const s of sides) {
    // Side by side (rule 'shared-core'), two generators share the client core and two servers the
    // server core: the rule holds for the two together, which is what each core carried.
    const shared = rule === 'shared-core';
    const generator = median(shared ? s.pairGenerator : s.generator);
    const server = median(shared ? s.pairServer : s.server);
    const both = shared ? ' (both sides)' : '';
    if (!(generator <= GENERATOR_MAX)) reasons.push(`${s.name} generator CPU${both} ${fmt(generator, 2)} > ${GENERATOR_MAX}`);
    if ((rule === 'throughput' || shared) && !(server >= SERVER_MIN)) {
      // Where the rest of the core went: other processes (a noisy machine) or idle (the server
      // waited, e.g. on a starved generator).
      const others = median(s.serverCore.map((busy, i) => busy - (shared ? s.pairServer : s.server)[i]));
      const idle = median(s.serverCore.map((busy) => 1 - busy));
      const rest = Number.isFinite(idle) ? ` (rest of its core: ${fmt(Math.max(0, others), 2)} other processes, ${fmt(idle, 2)} idle)` : '';
      // An idle server with a generator to spare is usually a generator whose core others took.
      const starved = median(s.generatorCore.map((busy, i) => busy - (shared ? s.pairGenerator : s.generator)[i]));
      const generator = starved > OTHERS_MAX ? `; other processes used ${fmt(starved, 2)} of the generator's core` : '';
      reasons.push(`${s.name} server CPU${both} ${fmt(server, 2)} < ${SERVER_MIN}${rest}${generator}`);
    }
    if (shared) {
      // The rates compare costs only when the scheduler gave each side the same share of the core.
      const split = median(s.server.map((own, i) => own / s.pairServer[i]));
      if (!(split >= SPLIT_MIN && split <= 1 - SPLIT_MIN)) reasons.push(`${s.name} took ${fmt(split, 2)} of the shared server core, not about half`);
    }
    if (s.failed > 0) reasons.push(`${s.name}: ${s.failed} failed requests`);
    const off = Math.max(0, ...s.rateOff.map((x) => (Number.isFinite(x) ? x : Infinity)));
    if (off > RATE_TOLERANCE) reasons.push(`${s.name} achieved rate off the requested one by ${fmt(off * 100, 1)}% > ${RATE_TOLERANCE * 100}%`);
  }
  return reasons;
}

/** Which cores other processes used more than OTHERS_MAX of, beyond the bench's own share. */
function noise(sides) {
  const found = [];
  for (const s of sides) {
    for (const [core, own] of [['serverCore', 'server'], ['generatorCore', 'generator']]) {
      const others = median(s[core].map((busy, i) => busy - s[own][i]));
      if (others > OTHERS_MAX) found.push(`others used ${fmt(others, 2)} of the ${s.name} ${own} core`);
    }
  }
  return found;
}

/**
 * Resolves each figure to its median, baseline, ratio and verdict. A figure with `sides` (and
 * `rule`: 'throughput', 'shared-core' or 'latency') is INVALID when its runs or its baseline's break the rule
 * above; otherwise PASS/MISS against its target, a latency figure marked noisy (OTHERS_MAX).
 */
export function evaluate(figure) {
  const value = figure.runs && figure.runs.length > 0 ? median(figure.runs) : NaN;
  const base = figure.baseline ? (figure.baseline.value ?? median(figure.baseline.runs ?? [])) : NaN;
  // Paired figures: the median of each run's ratio to the baseline run next to it (rounds.mjs).
  const ratio = figure.pairRatios ? median(figure.pairRatios) : value / base;
  const reasons = figure.sides ? invalidReasons(figure.sides, figure.rule) : [];
  let verdict = '';
  if (figure.unavailable) verdict = 'not available';
  else if (reasons.length > 0) verdict = `INVALID (${reasons.join('; ')})`;
  else if (figure.target) verdict = Number.isFinite(value) && figure.target.pass(value, base, ratio) ? 'PASS' : 'MISS';
  if (verdict === '' || verdict === 'PASS' || verdict === 'MISS') {
    const noisy = figure.rule === 'latency' ? noise(figure.sides) : [];
    if (noisy.length > 0) verdict = `${verdict || '-'} (noisy: ${noisy.join('; ')})`;
  }
  return { ...figure, value, base, ratio, verdict };
}

/**
 * One row per target of a scenario's interleaved rounds: medians of req/s, p50, p99 and p99.9, their
 * ratios to the `baseline` target's medians, the CPU shares (with how busy each core was),
 * bytes per response and whether the target's own runs pass the INVALID rule (`rule` as in
 * `invalidReasons`). `pairedOnly`: ratios only for rows whose runs carry their own baseline run.
 */
export function targetsTable({ title, targets, results, baseline, rule, pairedOnly = false }) {
  const med = (name, field) => median(results[name].map((r) => r[field]));
  // With paired runs (rounds.mjs `pairWith`, shared-core.mjs), the median of each run's ratio to
  // its own baseline run. `pairedOnly`: a row without one (another pair's baseline) gets none.
  const ratio = (name, field) => {
    const runs = results[name];
    const paired = name !== baseline && runs.every((r) => r.baselineRun !== undefined);
    if (!paired && name !== baseline && pairedOnly) return '-';
    return `${fmt(paired ? median(runs.map((r) => r[field] / r.baselineRun[field])) : med(name, field) / med(baseline, field), 3)}x`;
  };
  return {
    title,
    head: ['target', 'req/s', `x ${baseline}`, 'p50 ms', 'p99 ms', `p99 x ${baseline}`, 'p99.9 ms', 'generator CPU (core busy)', 'server CPU (core busy)', 'bytes/response', 'valid'],
    rows: targets.map((t) => {
      const reasons = invalidReasons([side(t.name, results[t.name])], rule);
      return [
        t.label ?? t.name,
        fmt(med(t.name, 'rps'), 0),
        ratio(t.name, 'rps'),
        fmt(med(t.name, 'p50'), 3),
        fmt(med(t.name, 'p99'), 3),
        ratio(t.name, 'p99'),
        fmt(med(t.name, 'p999'), 3),
        `${fmt(med(t.name, 'generatorCpu'), 2)} (${fmt(med(t.name, 'generatorCoreBusy'), 2)})`,
        `${fmt(med(t.name, 'serverCpu'), 2)} (${fmt(med(t.name, 'serverCoreBusy'), 2)})`,
        fmt(med(t.name, 'bytesPerResponse'), 0),
        reasons.length > 0 ? `INVALID (${reasons.join('; ')})` : 'yes',
      ];
    }),
  };
}

export const fmt = (v, d) => (Number.isFinite(v) ? v.toFixed(d) : '-');

/** "0.97 / 0.99": the median CPU share of each side of a figure (its runs, then its baseline's). */
const cpuCell = (f, field) => (f.sides ? f.sides.map((s) => fmt(median(s[field]), 2)).join(' / ') : '-');

function rows(figures) {
  return figures.map((f) => [
    f.label,
    f.unavailable && !Number.isFinite(f.value) ? 'n/a' : fmt(f.value, f.decimals),
    (f.runs ?? []).map((v) => fmt(v, f.decimals)).join(' / ') || '-',
    f.baseline ? `${fmt(f.base, f.decimals)} (${f.baseline.label})` : '-',
    Number.isFinite(f.ratio) && f.id !== 'economy.one' && f.id !== 'economy.two' ? `${f.ratio.toFixed(3)}x` : Number.isFinite(f.ratio) ? f.ratio.toFixed(4) : '-',
    f.target ? f.target.text : '-',
    cpuCell(f, 'generator'),
    cpuCell(f, 'server'),
    f.verdict || '-',
  ]);
}

const HEAD = ['figure', 'median', 'runs', 'baseline (median)', 'ratio', 'target', 'generator CPU', 'server CPU', 'result'];

function textTable(head, body) {
  const all = [head, ...body];
  const widths = head.map((_, i) => Math.max(...all.map((r) => String(r[i]).length)));
  const line = (r) => r.map((c, i) => String(c).padEnd(widths[i])).join('  ').trimEnd();
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n');
}

function mdTable(head, body) {
  const cell = (c) => String(c).replace(/\|/g, '\\|');
  return [`| ${head.map(cell).join(' | ')} |`, `|${head.map(() => '---').join('|')}|`, ...body.map((r) => `| ${r.map(cell).join(' | ')} |`)];
}

/** The console output: every scenario's own tables (`{ title, head, rows }`), then the figures. */
export function printTables(figures, tables) {
  const out = [];
  for (const t of tables) out.push(`${t.title}\n${textTable(t.head, t.rows)}`, '');
  out.push(textTable(HEAD, rows(figures)));
  for (const f of figures) if (f.unavailable) out.push(`  ${f.label}: not available: ${f.unavailable}`);
  return out.join('\n');
}

export function writeResults(file, { env, settings, figures, tables, notes, errors }) {
  const md = [];
  md.push('# perch benchmark results', '');
  md.push(
    `Generated by \`npm run bench\` in bench/. Each figure is the median of the rounds listed; the ratio is the median against its baseline's median, or, for paired figures (the hit path), the median of each run's ratio to the baseline run made just before it. Generator and server CPU are the median share of one core used by the load generator (wrk) and by the server's processes during the runs (figure / baseline); in the per-target tables, "core busy" is how busy that core was whoever used it, so a share well below it means other processes took the core. A figure is **INVALID** instead of PASS/MISS when the generator used more than ${GENERATOR_MAX} of its core, when a throughput figure's server used less than ${SERVER_MIN} of its own (latency figures: the generator rule only), or when any request failed; the reason is given. Figures measured side by side (two servers sharing the server core, each loaded by its own wrk on the client core: the tracing scenario) are held to the same rule for the two together: both generators under ${GENERATOR_MAX} of the client core, both servers over ${SERVER_MIN} of the server core, each server between ${SPLIT_MIN} and ${1 - SPLIT_MIN} of the two servers' CPU. A latency figure is marked noisy (its verdict kept) when other processes used more than ${OTHERS_MAX} of the server's or the generator's core beyond the bench's own share.`,
    '',
  );
  if (settings.smoke) md.push(`> **Smoke run** (${settings.durationS} s x ${settings.runs}): figures are noisy and only show that the harness works.`, '');
  md.push('| | |', '|---|---|');
  for (const [k, v] of env) md.push(`| ${k} | ${v} |`);
  md.push('');
  md.push('## Figures', '');
  md.push(...mdTable(HEAD, rows(figures)));
  md.push('');
  for (const t of tables) md.push(`## ${t.title}`, '', ...mdTable(t.head, t.rows), '');
  const unavailable = figures.filter((f) => f.unavailable);
  if (unavailable.length > 0) {
    md.push('Not available:', '');
    for (const f of unavailable) md.push(`- ${f.label}: ${f.unavailable}`);
    md.push('');
  }
  if (errors.length > 0) {
    md.push('## Scenarios that failed', '');
    for (const e of errors) md.push(`- ${e}`);
    md.push('');
  }
  md.push('## Notes', '');
  for (const n of notes) md.push(`- ${n}`);
  md.push('');
  md.push('## Method', '');
  md.push(
    '- Servers (perch, the upstream stand-in, the ceiling, redis-server, nginx, varnishd) are pinned to one CPU and the load generator to the other with `taskset`: wrk (one thread) for the hit, miss and Redis-frozen runs, an undici loop in this Node process for the fixed request lists (economy, memory fill).',
    "- Generator CPU is wrk's own user + system time (bash `times` after wrk exits); server CPU is utime + stime of the server's processes from /proc (every thread; varnishd's manager and cache child); both divided by wrk's measuring window.",
    '- Every target gets a warm-up run, then the measured runs go in interleaved rounds (round r runs every target once), so drift and neighbours hit every target alike; figures are medians over rounds, ratios are median against median. The hit path is paired: the ceiling runs right before every other target, in an order rotated each round, and its ratios are the median of each run against the ceiling run just before it (the speed of a core here drifts by up to a third within a minute, and in a fixed order the first targets of a round measured faster).',
    '- Hit path: one cached ~10 KB tweets page, keep-alive connections. The ceiling is a bare node:http server sending the same bytes with the same headers as a perch hit. perch runs with auth, its rate limit (in memory, or in Redis through `rate_limits_redis`), metrics and the access log at info written to a file. nginx and Varnish only serve the cached page (see the notes).',
    '- Hit rate: open-loop load (lib/open-loop.mjs) at half of perch\'s saturated throughput: request i is due at start + i / rate, latency counts from that due time (no coordinated omission), 64 keep-alive connections with one request in flight each and one queue; the generator is a Node process pinned to the client CPU, its CPU and the server\'s read from /proc at the edges of its window; a run whose sent or answered rate is more than 1% off the requested one is INVALID.',
    '- Miss path: every request has a path of its own (a wrk Lua request() counting user ids, a new range per run), so each is a miss that perch forwards and stores; added latency is perch minus direct for each round, median over the rounds.',
    '- Economy: counts the requests reaching the upstream stand-in; each run starts from empty caches (fresh perch processes, Redis FLUSHALL). The 2-instance figure is reported only when perch actually wrote keys to Redis.',
    '- Memory: VmRSS of the perch process from /proc, 1 s after the fill finished; MiB = 2^20 bytes.',
    '',
  );
  writeFileSync(file, md.join('\n'));
}
