// A month's quota over HTTP: one perch process (dist/) with `quota: { requests: 1000000,
// per_seconds: 2678400 }` in front of a node:http provider in this process, and 30,000 distinct
// misses one after another, with a 4 MiB cache so that RSS shows the rest. Prints the mean miss time and perch's RSS per 1,000 misses, and the
// first and last thousand side by side. `node bench/quota-misses.mjs` after `npm run build`.
import { createServer } from 'node:http';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { bodyFactory } from './lib/bodies.mjs';
import { BENCH_KEY } from './lib/perch.mjs';
import { freePort, installCleanup, memoryOf, start, waitUntilServing } from './lib/procs.mjs';

const MISSES = Number(process.env.QUOTA_MISSES ?? 30_000);
const BLOCK = 1000;
installCleanup();
const bodies = bodyFactory();
const provider = createServer((req, res) => {
  const id = /\/users\/(\d+)/.exec(req.url ?? '')?.[1] ?? '1';
  const text = bodies.user(id);
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
});
await new Promise((resolve) => provider.listen(0, '127.0.0.1', resolve));
const dir = mkdtempSync(join(os.tmpdir(), 'perch-quota-misses-'));
const port = await freePort();
const config = join(dir, 'perch.yaml');
writeFileSync(
  config,
  `server: { host: 127.0.0.1, port: ${port} }
auth: { keys: [ { id: bench, key: "${BENCH_KEY}", plan: unlimited } ] }
rate_limits: { unlimited: { capacity: 1000000000, refill_per_second: 1000000000 } }
upstreams:
  bench: { kind: v1, url: "http://127.0.0.1:${provider.address().port}", timeout_ms: 10000, quota: { requests: 1000000, per_seconds: 2678400 } }
cache: { memory: { max_bytes: 4194304 } }
log: { level: warn }
`,
);
const perch = start('perch', process.execPath, [new URL('../dist/src/main.js', import.meta.url).pathname, '--config', config]);
try {
  const base = `http://127.0.0.1:${port}`;
  await waitUntilServing(perch, `${base}/healthz`, { timeoutMs: 20_000 });
  const rows = [];
  let t = performance.now();
  for (let i = 1; i <= MISSES; i++) {
    const res = await request(`${base}/v1/users/${1_000_000 + i}`, { headers: { 'x-api-key': BENCH_KEY } });
    await res.body.dump();
    if (res.statusCode !== 200) throw new Error(`miss ${i}: ${res.statusCode}`);
    if (i % BLOCK === 0) {
      const now = performance.now();
      rows.push({ misses: i, 'mean miss ms': ((now - t) / BLOCK).toFixed(3), 'perch RSS MiB': (memoryOf(perch.pid).rss / 2 ** 20).toFixed(1) });
      t = performance.now();
    }
  }
  console.table(rows);
  console.log(`first ${BLOCK}: ${rows[0]['mean miss ms']} ms/miss, last ${BLOCK}: ${rows.at(-1)['mean miss ms']} ms/miss`);
} finally {
  await perch.stop();
  provider.close();
  rmSync(dir, { recursive: true, force: true });
}
