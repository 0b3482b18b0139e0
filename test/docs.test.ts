import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { parseConfig } from '../src/config/load.js';
import { startRedis } from './helpers/redis-server.js';
import { startPerch, testConfig } from './helpers/perch.js';
import { tempDir } from './helpers/temp-dir.js';

// Tests run from dist/test; the documentation sits at the repository root.
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const read = (path: string) => readFileSync(join(ROOT, path), 'utf8');
const run = promisify(execFile);

/** Every Markdown file a reader follows links through; the checker resolves them offline. */
const DOCUMENTS = ['README.md', 'SECURITY.md', 'ARCHITECTURE.md', 'docs', 'bench/README.md', 'bench/RESULTS.md'];
const REMARK = join(ROOT, 'node_modules', '.bin', 'remark');
const REMARK_RC = join(ROOT, '.remarkrc.json');

/**
 * remark-cli with remark-validate-links (.remarkrc.json): every relative link must name a file
 * that exists and every #anchor a heading of its page. `--frail` turns its warnings into exit 1.
 */
async function checkLinks(cwd: string, files: readonly string[]): Promise<{ ok: boolean; report: string }> {
  try {
    const { stderr } = await run(REMARK, ['--rc-path', REMARK_RC, '--no-stdout', '--frail', '--quiet', '--no-color', ...files], { cwd, timeout: 60_000 });
    return { ok: true, report: stderr };
  } catch (error) {
    const failed = error as { code?: unknown; stderr?: string };
    if (typeof failed.code !== 'number') throw error;
    return { ok: false, report: failed.stderr ?? '' };
  }
}

test('README.md stays within 250 lines and starts a newcomer with `npm ci && npm start` and `npm test`', { timeout: 10_000 }, () => {
  const readme = read('README.md');
  const lines = readme.split('\n').length - (readme.endsWith('\n') ? 1 : 0);
  assert.ok(lines <= 250, `README.md has ${lines} lines`);
  const quickStart = /\n## Quick start\n[\s\S]*?```sh\n([\s\S]*?)```/.exec(readme)?.[1] ?? '';
  assert.match(quickStart, /^npm ci && npm start\s/m);
  assert.match(quickStart, /^npm test\s/m);
});

test("the README's documentation index lists every page of docs/, and only those", { timeout: 10_000 }, () => {
  const index = /\n## Documentation\n([\s\S]*?)\n## /.exec(read('README.md'))?.[1] ?? '';
  const listed = [...index.matchAll(/\]\(docs\/([\w-]+\.md)\)/g)].map((match) => match[1]);
  const pages = readdirSync(join(ROOT, 'docs')).filter((name) => name.endsWith('.md'));
  assert.deepEqual([...listed].sort(), pages.sort());
});

test('every relative link and #anchor in README.md, docs/, SECURITY.md, ARCHITECTURE.md and bench/ resolves', { timeout: 120_000 }, async () => {
  const { ok, report } = await checkLinks(ROOT, DOCUMENTS);
  assert.ok(ok, report);
});

test('the link check fails on a missing page, a missing heading and a missing heading of another page', { timeout: 120_000 }, async (t) => {
  // The check above passes only while the checker really runs: held here on links known to be broken.
  const dir = tempDir(t, 'perch-links-');
  writeFileSync(join(dir, 'a.md'), '# A\n\n## Here\n\n[fine](#here) [fine too](b.md#there)\n');
  writeFileSync(join(dir, 'b.md'), '# B\n\n## There\n\n[page](c.md) [heading](#nowhere) [heading elsewhere](a.md#gone)\n');
  const { ok, report } = await checkLinks(dir, ['a.md', 'b.md']);
  assert.equal(ok, false);
  assert.match(report, /Cannot find file `c\.md`/);
  assert.match(report, /Cannot find heading for `#nowhere`/);
  assert.match(report, /Cannot find heading for `#gone` in `a\.md`/);
  assert.doesNotMatch(report, /a\.md\n\s+\d+:\d+/, 'a.md has no broken link');
});

test('every metric perch registers is in the metrics table of docs/observability.md, and the table names no other', { timeout: 30_000 }, async (t) => {
  // With cache.redis, so that the metrics registered only with a Redis tier are there too.
  const redis = await startRedis(t);
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', `cache: { redis: { url: "${redis.url}" } }`));
  const exposition = await (await fetch(`${perch.url}/metrics`)).text();
  const registered = new Set([...exposition.matchAll(/^# TYPE (\S+) /gm)].map((match) => match[1]!));
  const page = read('docs/observability.md');
  const table = /\n## Metrics\n[\s\S]*?\n(\| metric \|[\s\S]*?)\n\n/.exec(page)?.[1] ?? '';
  const documented = new Set([...table.matchAll(/^\| `([a-z_*]+)`/gm)].map((match) => match[1]!));
  const own = [...registered].filter((name) => name.startsWith('perch_'));
  assert.ok(own.length >= 30, `only ${own.length} perch_ metrics registered`);
  assert.deepEqual(
    own.filter((name) => !documented.has(name)),
    [],
    'registered but not documented',
  );
  assert.deepEqual(
    [...documented].filter((name) => name.startsWith('perch_') && !registered.has(name)),
    [],
    'documented but not registered',
  );
  // prom-client's default metrics are one row, by prefix.
  assert.ok(documented.has('process_*'), 'the process_* and nodejs_* row');
  for (const name of registered) assert.ok(/^(perch|process|nodejs)_/.test(name), `${name} has no documented prefix`);
});

test("the README's production configuration passes perch's own validation", { timeout: 10_000 }, (t) => {
  const yaml = /\n## A production configuration\n[\s\S]*?```yaml\n([\s\S]*?)```/.exec(read('README.md'))?.[1];
  assert.ok(yaml !== undefined);
  // Its secrets are files: real ones, in a temp dir standing in for /run/secrets.
  const dir = tempDir(t, 'perch-secrets-');
  for (const name of yaml.matchAll(/\$\{file:\/run\/secrets\/([\w-]+)\}/g)) writeFileSync(join(dir, name[1]!), `${name[1]}-secret-0123456789\n`);
  const config = parseConfig(yaml.replaceAll('/run/secrets/', `${dir}/`), { CRAWLER_KEY: 'crawler-secret-0123456789' });
  assert.deepEqual(Object.keys(config.rate_limits).sort(), ['app', 'batch']);
  assert.equal(config.auth.keys?.length, 2);
});
