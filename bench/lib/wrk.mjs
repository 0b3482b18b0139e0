// wrk (C, from Debian's packages) as the load generator: one thread on its own core, so the
// generator is far from the bottleneck, with its CPU time and the server's measured for the run.
// Both are fractions of one core over wrk's own measuring window, so a figure can say whether
// it measured the server (server near 1.00, generator well below) or something else.
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { busyShare, cpuJiffies, cpuSplitOf } from './procs.mjs';

/** wrk's version ("wrk debian/4.1.0-3+b2 [epoll]"), or null when wrk is not on PATH (bench/setup.sh installs it). */
export function wrkVersion() {
  const first = (text) => String(text).split('\n')[0].replace(/\s*Copyright.*$/, '').trim();
  try {
    return first(execFileSync('wrk', ['--version'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }));
  } catch (error) {
    // wrk --version prints its version, then the usage, and exits 1.
    return error.status === 1 ? first(error.stdout) : null;
  }
}

/**
 * wrk calls done() once after the run: one line with its percentiles (HdrHistogram, in µs) and
 * error counts. The histogram has wrk's synthetic samples in it by then (stats_correct, for the
 * requests a slow answer held back; see open-loop.mjs), so the tail is partly inferred.
 */
const DONE = `done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("PERCH %d %d %d %d %d %.3f %.3f %.3f\\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status, summary.bytes,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency:percentile(99.9) / 1000))
end
`;

/**
 * A request() function giving every request a path of its own: `prefix` + an id + `suffix`, the
 * id being `idPrefix` followed by a 12-digit counter (as digits in a string: Lua numbers are
 * doubles, exact only to 2^53). wrk then builds each request in Lua (slower than its prebuilt
 * request, which is why only the miss path uses it).
 */
export function distinctPathsLua({ prefix, idPrefix, suffix = '' }) {
  return `local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "${prefix}${idPrefix}" .. string.format("%012d", n) .. "${suffix}")
end
`;
}

let scriptDir;
let scripts = 0;
function scriptFile(lua) {
  if (scriptDir === undefined) {
    scriptDir = mkdtempSync(join(tmpdir(), 'perch-bench-wrk-'));
    process.on('exit', () => rmSync(scriptDir, { recursive: true, force: true }));
  }
  const file = join(scriptDir, `run-${++scripts}.lua`);
  writeFileSync(file, lua + DONE);
  return file;
}

/**
 * One wrk run: `connections` keep-alive connections for `durationS` seconds on `url + path`
 * (or on the paths the `lua` request() function makes), wrk pinned to `cpu`, the servers on
 * `serverCpu`. Resolves with requests per second answered below 400, latency percentiles (ms,
 * every response: p50, p99, p999 for p99.9), error-status (>= 400) and socket error counts, bytes
 * per response, the CPU share (of one core) of wrk and of the server pids, and how busy each of
 * the two cores was, whoever used it.
 */
export async function wrk({ url, path = '/', headers = {}, connections, durationS, cpu = null, serverCpu = null, serverPids = [], lua = '' }) {
  const args = ['-t1', `-c${connections}`, `-d${durationS}s`, '-s', scriptFile(lua)];
  for (const [name, value] of Object.entries(headers)) args.push('-H', `${name}: ${value}`);
  args.push(url + path);
  const command = [...(cpu === null ? [] : ['taskset', '-c', String(cpu)]), 'wrk', ...args];
  const serverBefore = serverPids.map((pid) => cpuSplitOf(pid));
  const coresBefore = [cpuJiffies(cpu), cpuJiffies(serverCpu)];
  // bash's `times` prints the CPU time of the children it waited for: wrk's own, exactly (taskset
  // execs wrk), after wrk has exited.
  const child = spawn('bash', ['-c', '"$@"; status=$?; times; exit $status', 'wrk', ...command], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  // 'close', not 'exit': at 'exit' the pipes may still hold output, and bash's `times` comes last
  // (the rare "no CPU times after wrk" of earlier runs).
  const code = await new Promise((resolve) => child.once('close', resolve));
  const serverAfter = serverPids.map((pid) => cpuSplitOf(pid));
  const sum = (field) => serverAfter.map((after, i) => after[field] - serverBefore[i][field]).reduce((a, b) => a + b, 0);
  const serverUserSeconds = sum('user');
  const serverSystemSeconds = sum('system');
  const serverSeconds = serverUserSeconds + serverSystemSeconds;
  const coresAfter = [cpuJiffies(cpu), cpuJiffies(serverCpu)];
  if (code !== 0) throw new Error(`wrk exited with ${code}: ${out.slice(-500)}`);
  const run = parse(out);
  // Both shares are over wrk's measuring window: the server is idle outside it, and wrk's few
  // milliseconds of start-up only make its share look higher (the safe side).
  const windowS = run.durationUs / 1e6;
  // The cores' busy shares are over the whole wrk process (a few ms longer): what else ran there.
  return {
    ...run,
    generatorCpu: childCpuSeconds(out) / windowS,
    serverCpu: serverSeconds / windowS,
    serverUserCpu: serverUserSeconds / windowS,
    serverSystemCpu: serverSystemSeconds / windowS,
    generatorCoreBusy: busyShare(coresBefore[0], coresAfter[0]),
    serverCoreBusy: busyShare(coresBefore[1], coresAfter[1]),
  };
}

/** The children's user + system seconds: the second line of bash's `times`. */
function childCpuSeconds(out) {
  const lines = out.split('\n').filter((l) => /^\d+m[\d.]+s \d+m[\d.]+s$/.test(l.trim()));
  if (lines.length < 2) throw new Error(`no CPU times after wrk: ${out.slice(-300)}`);
  return lines
    .at(-1)
    .trim()
    .split(' ')
    .map((t) => {
      const [, m, s] = /^(\d+)m([\d.]+)s$/.exec(t);
      return Number(m) * 60 + Number(s);
    })
    .reduce((a, b) => a + b, 0);
}

function parse(out) {
  const line = out.split('\n').find((l) => l.startsWith('PERCH '));
  if (line === undefined) throw new Error(`wrk printed no summary: ${out.slice(-500)}`);
  const [requests, durationUs, socketErrors, errorStatuses, bytes, p50, p99, p999] = line.split(' ').slice(1).map(Number);
  return {
    // wrk counts every response; those with a status >= 400 (wrk's `errors.status`) are not
    // served pages. A run with any of them or a socket error is reported INVALID anyway
    // (report.mjs); this keeps the rate itself honest too.
    rps: (requests - errorStatuses) / (durationUs / 1e6),
    requests,
    durationUs,
    socketErrors,
    errorStatuses,
    bytesPerResponse: requests > 0 ? bytes / requests : NaN,
    p50,
    p99,
    p999,
  };
}
