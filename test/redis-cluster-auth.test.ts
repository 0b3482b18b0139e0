import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedisCluster, type TestRedisCluster } from './helpers/redis-cluster.js';
import { selfSignedCertificate } from './helpers/tls-files.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

/** Generous: 2 shared cores run up to six redis-servers, perch and the test. */
const COMMAND_TIMEOUT_MS = 1000;
/** Characters a URL must percent-encode, so decoding is exercised too. */
const PASSWORD = 'p@ss:w/rd 1';
const PATHS = Array.from({ length: 9 }, (_, i) => `/v1/users/${i + 1}`);

async function startOnCluster(t: TestContext, seeds: readonly string[], extra = ''): Promise<RunningPerch> {
  const upstream = await startUpstream(t, sampleProvider);
  const list = seeds.map((url) => JSON.stringify(url)).join(', ');
  const yaml = `cache: { stale_seconds: 0, ttl_seconds: { user: 300 }, redis: { cluster: [${list}], prefix: "t:", command_timeout_ms: ${COMMAND_TIMEOUT_MS}${extra} } }`;
  return startPerch(t, testConfig(v1('main', upstream.url), yaml), { clock: new ManualClock() });
}

/** The keys matching `pattern` on any node (a replica holds copies of its master's). */
async function storedKeys(cluster: TestRedisCluster, pattern: string): Promise<string[]> {
  const outputs = await Promise.all(cluster.nodes.map((node) => cluster.cli(node.port, '--scan', '--pattern', pattern)));
  return [...new Set(outputs.flatMap((out) => out.split('\n')).filter((key) => key !== ''))].sort();
}

async function missesAreStored(perch: RunningPerch, cluster: TestRedisCluster): Promise<void> {
  await waitFor(() => perch.cache.redisConnected === true, 10_000);
  for (const path of PATHS) {
    const response = await perch.request(path);
    assert.equal(response.status, 200, path);
  }
  assert.deepEqual(await storedKeys(cluster, 't:c:/v1/users/[0-9]*'), PATHS.map((p) => `t:c:${p}`).sort());
  assert.deepEqual(perch.cache.redisStats, { errors: 0, skipped: 0, cleanupErrors: 0 });
}

test('cluster with requirepass (3 masters + 3 replicas): seeds with the password store entries', { timeout: 30_000 }, async (t) => {
  const cluster = await startRedisCluster(t, { replicas: 1, password: PASSWORD });
  assert.ok(cluster.urls.every((url) => url.startsWith(`redis://:${encodeURIComponent(PASSWORD)}@127.0.0.1:`)));
  const perch = await startOnCluster(t, cluster.urls);
  await missesAreStored(perch, cluster);
});

test('cluster over TLS with requirepass: rediss:// seeds with the password store entries', { timeout: 30_000 }, async (t) => {
  const tls = await selfSignedCertificate(t);
  const cluster = await startRedisCluster(t, { password: PASSWORD, tls });
  assert.ok(cluster.urls.every((url) => url.startsWith('rediss://')));
  const perch = await startOnCluster(t, cluster.urls, `, tls_ca_file: ${JSON.stringify(tls.cert)}`);
  await missesAreStored(perch, cluster);
});
