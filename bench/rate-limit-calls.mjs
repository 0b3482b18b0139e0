// Redis commands per 1000 requests and requests a second with the token buckets in Redis, for
// two builds of perch side by side (interleaved rounds, medians): did a change to the leased
// buckets make the hit path ask Redis more, or serve fewer hits?
//
//   node bench/rate-limit-calls.mjs <dist-before> <dist-after> [rounds] [seconds]
//
// Each round starts a fresh redis-server and one perch process of each build on it in turn,
// with the built-in fixture upstream and a plan whose leases are 100 tokens (capacity 10^6,
// 1000 a second), warms the one cached path, resets Redis's command statistics and then loads
// it with 32 concurrent keep-alive clients for `seconds`. Redis commands are counted from
// `INFO commandstats`; the client is an undici Pool in this process.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Redis } from 'ioredis';
import { Pool } from 'undici';

const [before, after, roundsArg = '3', secondsArg = '5'] = process.argv.slice(2);
if (before === undefined || after === undefined) {
  console.error('usage: node bench/rate-limit-calls.mjs <dist-before> <dist-after> [rounds] [seconds]');
  process.exit(2);
}
const ROUNDS = Number(roundsArg);
const SECONDS = Number(secondsArg);
const KEY = 'bench-key-0123456789abcdef';

function freePort() {
  return new Promise((ok) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

async function startRedis() {
  const port = await freePort();
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: ['ignore', 'pipe', 'ignore'] });
  await new Promise((ok) => proc.stdout.on('data', (d) => d.toString().includes('Ready to accept') && ok()));
  return { port, stop: () => new Promise((ok) => (proc.once('exit', ok), proc.kill('SIGKILL'))) };
}

async function startPerch(dist, configPath) {
  const proc = spawn(process.execPath, [join(resolve(dist), 'src/main.js'), '--config', configPath], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const url = await new Promise((ok, fail) => {
    const on = (d) => {
      out += d.toString();
      const m = /perch is up on (\S+)\n/.exec(out);
      if (m) ok(m[1]);
    };
    proc.stdout.on('data', on);
    proc.stderr.on('data', on);
    proc.once('exit', () => fail(new Error(`perch exited: ${out}`)));
  });
  proc.stdout.resume();
  return { url, stop: () => new Promise((ok) => (proc.once('exit', ok), proc.kill('SIGTERM'))) };
}

async function load(url) {
  const pool = new Pool(url, { connections: 32, pipelining: 1 });
  let done = 0;
  let ok = 0;
  const end = performance.now() + SECONDS * 1000;
  const cpu0 = process.cpuUsage();
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (performance.now() < end) {
        const res = await pool.request({ path: '/v1/users/1', method: 'GET', headers: { 'x-api-key': KEY } });
        await res.body.dump();
        done++;
        if (res.statusCode === 200) ok++;
      }
    }),
  );
  const cpu = process.cpuUsage(cpu0);
  await pool.close();
  return { done, ok, rps: done / SECONDS, loadCpu: (cpu.user + cpu.system) / 1e6 / SECONDS };
}

function commands(info) {
  let total = 0;
  const by = {};
  for (const m of info.matchAll(/^cmdstat_([a-z|_]+):calls=(\d+)/gm)) {
    if (m[1] === 'info' || m[1] === 'config|resetstat') continue;
    by[m[1]] = Number(m[2]);
    total += Number(m[2]);
  }
  return { total, by };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const results = { before: [], after: [] };
const dir = mkdtempSync(join(tmpdir(), 'perch-rl-bench-'));
try {
  for (let round = 0; round < ROUNDS; round++) {
    for (const [name, dist] of round % 2 === 0 ? [['before', before], ['after', after]] : [['after', after], ['before', before]]) {
      const redis = await startRedis();
      const config = join(dir, `${name}.yaml`);
      writeFileSync(
        config,
        `server: { host: 127.0.0.1, port: 0 }
auth:
  keys:
    - { id: alpha, key: "${KEY}", plan: wide }
rate_limits:
  wide: { capacity: 1000000, refill_per_second: 1000 }
upstreams:
  fixture: { kind: fixture }
rate_limits_redis: { url: "redis://127.0.0.1:${redis.port}", command_timeout_ms: 200 }
log: { level: warn }
`,
      );
      const perch = await startPerch(dist, config);
      const client = new Redis(redis.port, '127.0.0.1');
      for (let i = 0; i < 200; i++) await fetch(`${perch.url}/v1/users/1`, { headers: { 'x-api-key': KEY } }).then((r) => r.arrayBuffer());
      await client.config('RESETSTAT');
      const run = await load(perch.url);
      const stats = commands(await client.info('commandstats'));
      client.disconnect();
      await perch.stop();
      await redis.stop();
      const per1000 = (stats.total / run.done) * 1000;
      results[name].push({ ...run, per1000 });
      console.log(`round ${round + 1} ${name}: ${run.rps.toFixed(0)} req/s (${run.ok} of ${run.done} allowed), ${per1000.toFixed(2)} Redis commands per 1000 requests ${JSON.stringify(stats.by)}, load generator ${(run.loadCpu * 100).toFixed(0)}% of a core${run.loadCpu > 0.85 ? ' INVALID' : ''}`);
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
const b = { rps: median(results.before.map((r) => r.rps)), per1000: median(results.before.map((r) => r.per1000)) };
const a = { rps: median(results.after.map((r) => r.rps)), per1000: median(results.after.map((r) => r.per1000)) };
console.log(`median before: ${b.rps.toFixed(0)} req/s, ${b.per1000.toFixed(2)} commands/1000`);
console.log(`median after:  ${a.rps.toFixed(0)} req/s, ${a.per1000.toFixed(2)} commands/1000`);
console.log(`ratio after/before: req/s ${(a.rps / b.rps).toFixed(3)}, commands per 1000 ${(a.per1000 / b.per1000).toFixed(3)}`);
