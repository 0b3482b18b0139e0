import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parseConfig } from '../src/config/load.js';
import { createPerch } from '../src/app/perch.js';
import { PERCH_VERSION } from '../src/version.js';
import { newEntry } from '../src/cache/entry.js';
import { captureLogs } from './helpers/log-capture.js';
import { KEY, OTHER_KEY, startPerch, testConfig, waitFor } from './helpers/perch.js';
import { onCleanup } from './helpers/cleanup.js';

const T = { timeout: 20_000 };
const DASHBOARD = fileURLToPath(new URL('../../deploy/grafana-dashboard.json', import.meta.url));

function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

async function scrape(url: string): Promise<string> {
  const res = await fetch(`${url}/metrics`);
  assert.equal(res.status, 200);
  return res.text();
}

/** `promtool check metrics` is the Prometheus project's own lint; .ci/run installs it. */
function promtool(): string | undefined {
  const probe = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
  return probe.error === undefined && probe.status === 0 ? 'promtool' : undefined;
}

test('perch_build_info names the version and Node; perch_key_requests_total counts every outcome per key', T, async (t) => {
  const perch = await startPerch(
    t,
    testConfig('demo: { kind: fixture }').replace('big: { capacity: 100000, refill_per_second: 100000 }', 'big: { capacity: 3, refill_per_second: 0.001 }'),
  );
  await perch.request('/v1/users/1');
  await perch.request('/v1/users/1');
  await perch.request('/v1/users/abc');
  await perch.request('/v1/users/1');
  await perch.request('/v1/users/1', { key: OTHER_KEY });
  await perch.request('/v1/users/1', { key: 'unknown-key-0123456789' });
  const text = await scrape(perch.url);
  assert.equal(sample(text, `perch_build_info{version="${PERCH_VERSION}",node="${process.version}"}`), 1);
  assert.match(PERCH_VERSION, /^\d+\.\d+\.\d+/);
  assert.equal(sample(text, 'perch_key_requests_total{key_id="alpha",status="200",cache="miss"}'), 1);
  assert.equal(sample(text, 'perch_key_requests_total{key_id="alpha",status="200",cache="hit"}'), 1);
  assert.equal(sample(text, 'perch_key_requests_total{key_id="alpha",status="400",cache="none"}'), 1);
  assert.equal(sample(text, 'perch_key_requests_total{key_id="alpha",status="429",cache="none"}'), 1);
  assert.equal(sample(text, 'perch_key_requests_total{key_id="bravo",status="200",cache="hit"}'), 1);
  // An unknown key has no id: 401s are in perch_requests_total only.
  assert.doesNotMatch(text, /perch_key_requests_total\{[^}]*status="401"/);
  assert.ok(!text.includes(KEY));
});

test('perch_cache_evictions_total counts entries the memory tier dropped for space, not deletes', T, async (t) => {
  const config = parseConfig(testConfig('demo: { kind: fixture }', 'cache: { memory: { max_bytes: 1048576 } }'), {});
  const perch = createPerch({ config, logger: captureLogs().logger });
  const { port } = await perch.listen();
  onCleanup(t, () => perch.close());
  const entry = newEntry({ status: 200, body: Buffer.alloc(300_000), storedAt: Date.now(), ttlMs: 60_000, generation: { all: 0, scope: 0 } });
  perch.cache.memory.set('/a', entry, 60_000);
  perch.cache.memory.delete('/a');
  assert.equal(sample(await scrape(`http://127.0.0.1:${port}`), 'perch_cache_evictions_total'), 0);
  for (const key of ['/1', '/2', '/3', '/4', '/5']) perch.cache.memory.set(key, entry, 60_000);
  // Three 300 KB entries fit in 1 MiB; the fourth and fifth each push the oldest out.
  assert.equal(sample(await scrape(`http://127.0.0.1:${port}`), 'perch_cache_evictions_total'), 2);
});

test('perch_cache_slab_* show the pool: regions cut, regions held back by an open request, stores that got memory of their own', T, async (t) => {
  const config = parseConfig(testConfig('demo: { kind: fixture }', 'cache: { memory: { max_bytes: 1048576 } }'), {});
  const perch = createPerch({ config, logger: captureLogs().logger });
  const { port } = await perch.listen();
  onCleanup(t, () => perch.close());
  const { memory } = perch.cache;
  const entry = (bytes: number) => newEntry({ status: 200, body: Buffer.alloc(bytes, 7), storedAt: Date.now(), ttlMs: 60_000, generation: { all: 0, scope: 0 } });
  const scraped = async () => {
    const text = await scrape(`http://127.0.0.1:${port}`);
    return {
      reserved: sample(text, 'perch_cache_slab_bytes{state="reserved"}'),
      cut: sample(text, 'perch_cache_slab_bytes{state="cut"}'),
      inUse: sample(text, 'perch_cache_slab_bytes{state="in_use"}'),
      idle: sample(text, 'perch_cache_slab_bytes{state="idle"}'),
      own: sample(text, 'perch_cache_slab_bytes{state="own"}'),
      waiting: sample(text, 'perch_cache_slab_regions_waiting'),
      full: sample(text, 'perch_cache_slab_own_memory_stores_total{reason="full"}'),
      tooLarge: sample(text, 'perch_cache_slab_own_memory_stores_total{reason="too_large"}'),
    };
  };
  assert.deepEqual(await scraped(), { reserved: 1_048_576, cut: 0, inUse: 0, idle: 0, own: 0, waiting: 0, full: 0, tooLarge: 0 });
  memory.set('/large', entry(300_000), 60_000);
  memory.delete('/large');
  // 60,000-byte bodies take 61,440-byte regions: 17 fit in the reservation. A request held open
  // keeps every region evicted meanwhile waiting, so the 18th store on finds none free.
  const open = memory.grace.enter();
  for (let i = 0; i < 20; i++) memory.set(`/k${String(i).padStart(2, '0')}`, entry(60_000), 60_000);
  const held = await scraped();
  // 13 entries in regions, the 3 stored when none was free outside the pool, and the 4 regions
  // of the entries evicted meanwhile idle, waiting for the open request.
  assert.deepEqual(held, { reserved: 1_048_576, cut: 17 * 61_440, inUse: 13 * 61_440, idle: 4 * 61_440, own: 3 * 60_000, waiting: 4, full: 3, tooLarge: 1 });
  assert.equal(memory.evictions, 4);
  assert.ok(memory.evictions > 0);
  memory.grace.leave(open);
  // The scrapes are requests too: the last one's response may close just after its body arrived.
  await waitFor(() => memory.grace.open === 0);
  memory.set('/after', entry(60_000), 60_000);
  assert.deepEqual(await scraped(), { ...held, waiting: 0 });
});

test('a refused reload shows in perch_config_last_reload_* and the /readyz checks; a good one clears it', T, async (t) => {
  const yaml = testConfig('demo: { kind: fixture }');
  const perch = createPerch({ config: parseConfig(yaml, {}), logger: captureLogs().logger });
  const { port } = await perch.listen();
  onCleanup(t, () => perch.close());
  const url = `http://127.0.0.1:${port}`;
  const ready = async () => {
    const res = await fetch(`${url}/readyz`);
    return { status: res.status, body: (await res.json()) as { status: string; checks: Record<string, string> } };
  };
  let text = await scrape(url);
  assert.equal(sample(text, 'perch_config_last_reload_successful'), 1);
  const loadedAt = sample(text, 'perch_config_last_reload_success_timestamp_seconds')!;
  assert.ok(Math.abs(loadedAt - Date.now() / 1000) < 60, String(loadedAt));
  assert.equal((await ready()).body.checks.config, 'ok');

  perch.reloadFailed();
  text = await scrape(url);
  assert.equal(sample(text, 'perch_config_last_reload_successful'), 0);
  assert.equal(sample(text, 'perch_config_last_reload_success_timestamp_seconds'), loadedAt);
  const degraded = await ready();
  // Still serving the previous configuration: ready, but not silently.
  assert.equal(degraded.status, 200);
  assert.equal(degraded.body.status, 'degraded');
  assert.match(degraded.body.checks.config!, /^last reload failed at \d{4}-.*Z: serving the configuration loaded at \d{4}-.*Z$/);
  assert.equal((await fetch(`${url}/v1/users/1`, { headers: { 'x-api-key': KEY } })).status, 200);

  perch.reload(parseConfig(yaml, {}));
  text = await scrape(url);
  assert.equal(sample(text, 'perch_config_last_reload_successful'), 1);
  assert.ok(sample(text, 'perch_config_last_reload_success_timestamp_seconds')! >= loadedAt);
  assert.deepEqual((await ready()).body.status, 'ok');
});

test('promtool check metrics finds nothing to fix in a scrape with traffic on every kind of series', T, async (t) => {
  const bin = promtool();
  if (bin === undefined) {
    // .ci/run installs it and sets PERCH_REQUIRE_PROMTOOL, so CI never skips this silently.
    assert.notEqual(process.env.PERCH_REQUIRE_PROMTOOL, '1', 'promtool is required but not on PATH');
    t.skip('promtool is not installed (Debian package "prometheus"; .ci/run installs it)');
    return;
  }
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  await perch.request('/v1/users/1');
  await perch.request('/v1/users/1');
  await perch.request('/v1/users/abc');
  await perch.request('/nope');
  const text = await scrape(perch.url);
  const result = spawnSync(bin, ['check', 'metrics'], { input: text, encoding: 'utf8', timeout: 10_000 });
  assert.equal(result.status, 0, `promtool check metrics:\n${result.stdout}${result.stderr}`);
  assert.doesNotMatch(text, /^nodejs_active_\w+_total /m);
  // The same numbers stay, under the names without the suffix.
  assert.match(text, /^# TYPE nodejs_active_handles gauge$/m);
});

test('the Grafana dashboard queries only exported metrics and never mixes units in a panel', T, async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  await perch.request('/v1/users/1');
  const exported = new Set([...(await scrape(perch.url)).matchAll(/^# TYPE (\w+) (\w+)/gm)].flatMap(([, name, type]) =>
    type === 'histogram' ? [`${name}_bucket`, `${name}_sum`, `${name}_count`] : [name!],
  ));
  // Series that exist only with Redis or after an event; the rest must be in this scrape.
  const conditional = new Set(['perch_redis_up']);
  const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as { panels: { title: string; targets?: { expr: string }[] }[] };
  for (const panel of dashboard.panels) {
    const names = new Set((panel.targets ?? []).flatMap((target) => [...target.expr.matchAll(/\b((?:perch|process|nodejs)_\w+)/g)].map((m) => m[1]!)));
    for (const name of names) assert.ok(exported.has(name) || conditional.has(name), `${panel.title}: ${name} is not exported`);
    const units = new Set([...names].map((name) => /_bytes$/.test(name) ? 'bytes' : /_seconds(_bucket|_sum|_count)?$/.test(name) ? 'seconds' : 'other'));
    assert.ok(!(units.has('bytes') && units.has('seconds')), `${panel.title} mixes bytes and seconds`);
  }
});

test('deploy/alerts.yml passes promtool check rules, and its unit tests (deploy/alerts.test.yml) pass', T, async (t) => {
  const bin = promtool();
  if (bin === undefined) {
    assert.notEqual(process.env.PERCH_REQUIRE_PROMTOOL, '1', 'promtool is required but not on PATH');
    t.skip('promtool is not installed (Debian package "prometheus"; .ci/run installs it)');
    return;
  }
  const deploy = fileURLToPath(new URL('../../deploy/', import.meta.url));
  const checked = spawnSync(bin, ['check', 'rules', 'alerts.yml'], { cwd: deploy, encoding: 'utf8', timeout: 10_000 });
  assert.equal(checked.status, 0, `promtool check rules:\n${checked.stdout}${checked.stderr}`);
  assert.match(checked.stdout, /SUCCESS: 3 rules found/);
  const tested = spawnSync(bin, ['test', 'rules', 'alerts.test.yml'], { cwd: deploy, encoding: 'utf8', timeout: 10_000 });
  assert.equal(tested.status, 0, `promtool test rules:\n${tested.stdout}${tested.stderr}`);
  // The rules read series perch exports: a renamed metric would leave them silent for ever.
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const exported = new Set([...(await scrape(perch.url)).matchAll(/^# TYPE (\w+) (\w+)$/gm)].flatMap(([, name, type]) =>
    type === 'histogram' ? [`${name}_count`, `${name}_sum`, `${name}_bucket`] : [name!],
  ));
  const rules = readFileSync(new URL('../../deploy/alerts.yml', import.meta.url), 'utf8');
  const used = rules.match(/perch_[a-z_]+/g) ?? [];
  assert.deepEqual([...new Set(used)].sort(), [
    'perch_key_provider_budget_limit',
    'perch_key_provider_budget_remaining',
    'perch_key_upstream_calls_total',
    'perch_upstream_queue_wait_seconds_count',
    'perch_upstream_refused_total',
  ]);
  for (const series of used) assert.ok(exported.has(series), `${series} is not a metric perch exports`);
});
