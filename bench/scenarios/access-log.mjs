// The access line's own cost, outside the server: `npm run access-log` (from bench/) writes
// 500,000 access lines through perch's logger (the access-line template and the line batcher)
// to /dev/null and prints the CPU per line, at level info and, for the cost of the call alone,
// at warn. The hit scenario measures what the line adds inside the server under load.
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { ensureBuilt } from '../lib/perch.mjs';

const LINES = 500_000;
const repoRoot = process.env.BENCH_PERCH_ROOT ?? dirname(dirname(dirname(fileURLToPath(import.meta.url))));
ensureBuilt(repoRoot, join(repoRoot, 'dist', 'src', 'main.js'));
const dist = (file) => import(pathToFileURL(join(repoRoot, 'dist', 'src', file)).href);
const [{ createLogger }, { createAccessLog }, { loggedPath, clip }, { LineBatcher }] = await Promise.all([
  dist('logging/logger.js'),
  dist('logging/access-log.js'),
  dist('logging/access-log-fields.js'),
  dist('logging/line-batcher.js'),
]);
const { openSync, closeSync } = await import('node:fs');

for (const level of ['info', 'warn']) {
  const fd = openSync('/dev/null', 'w');
  const logger = createLogger({ level }, new LineBatcher(fd));
  const accessLog = createAccessLog(logger);
  const before = process.cpuUsage();
  for (let i = 0; i < LINES; i++) {
    accessLog({
      req_id: '57fad2a2-5922-4474-b16a-d4397ca47f47',
      method: 'GET',
      path: loggedPath('/v1/users/1000000000000000001/tweets'),
      route: 'tweets',
      status: 200,
      cache: 'hit',
      upstream: null,
      upstream_ms: null,
      ms: (i % 100) / 100,
      key_id: 'bench',
      remote: '127.0.0.1',
      user_agent: clip(undefined),
    });
    // Let the batcher's asynchronous writes run, as they would between requests.
    if (i % 1000 === 0) await new Promise((resolve) => setImmediate(resolve));
  }
  await new Promise((resolve) => logger.flush(resolve));
  const used = process.cpuUsage(before);
  closeSync(fd);
  process.stdout.write(`access line at level ${level}: ${((used.user + used.system) / LINES).toFixed(2)} µs of CPU per line (${LINES} lines)\n`);
}
