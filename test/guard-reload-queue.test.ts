import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { KEY, testConfig, v1, waitFor } from './helpers/perch.js';
import { spawnPerch } from './helpers/perch-process.js';
import { startRedis } from './helpers/redis-server.js';
import { tempDir } from './helpers/temp-dir.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

// A reload applies the call cap to the misses already waiting for it (issue 56, item 2): the
// queue is kept across the reload, and its next ask is made under the new limits.

/** The most calls any window of `windowMs` holds, of those at or after `from`. */
function mostInAnyWindow(times: readonly number[], from: number, windowMs: number): number {
  const after = times.filter((t) => t >= from).sort((a, b) => a - b);
  let most = 0;
  for (let i = 0, j = 0; i < after.length; i++) {
    while (after[i]! - after[j]! >= windowMs) j++;
    most = Math.max(most, i - j + 1);
  }
  return most;
}

for (const shared of [false, true]) {
  test(`60 misses queued at 10/s, SIGHUP sets 1/s: from 1 s after the reload at most 2 calls in any second (${shared ? 'Redis' : 'memory'})`, { timeout: 40_000 }, async (t) => {
    const calls: number[] = [];
    const upstream = await startUpstream(t, (req, res) => {
      calls.push(Date.now());
      sampleProvider(req, res);
    });
    const redis = shared ? await startRedis(t) : undefined;
    const path = join(tempDir(t, 'perch-guard-reload-'), 'perch.yaml');
    const yaml = (rate: number) =>
      testConfig(
        v1('main', upstream.url, `max_requests_per_second: ${rate}, queue_timeout_ms: 6000, queue_size: 100`),
        redis === undefined ? '' : `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }`,
      );
    writeFileSync(path, yaml(10));
    const perch = await spawnPerch(t, path);
    const misses = Array.from({ length: 60 }, (_, i) =>
      fetch(`${perch.url}/v1/users/${1000 + i}`, { headers: { 'x-api-key': KEY } }).then(async (r) => {
        await r.arrayBuffer();
        return r.status;
      }),
    );
    await waitFor(() => calls.length >= 15, 10_000);
    writeFileSync(path, yaml(1));
    perch.process.kill('SIGHUP');
    await waitFor(() => perch.output().includes('configuration reloaded'), 5000);
    const reloadedAt = Date.now();
    const statuses = await Promise.all(misses);
    const most = mostInAnyWindow(calls, reloadedAt + 1000, 1000);
    t.diagnostic(`calls before the reload was seen: ${calls.filter((c) => c < reloadedAt).length}; after 1 s: ${calls.filter((c) => c >= reloadedAt + 1000).length}, at most ${most} in any second`);
    assert.ok(statuses.filter((s) => s === 200).length >= 15);
    assert.ok(calls.some((c) => c >= reloadedAt + 1000), 'waiters are still admitted after the reload');
    assert.ok(most <= 2, `at most 2 calls in any second from 1 s after the reload, got ${most}`);
  });
}
