import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { test } from 'node:test';
import { pollFor, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { MASTER_NAME, startSentinels } from './helpers/redis-sentinel.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

/**
 * How long the master stays frozen: it resumes after the switch (which comes 2-4 s into the
 * freeze), still a master. PERCH_SENTINEL_FREEZE_MS=20000 runs the full 20 s scenario.
 */
const FREEZE_MS = Number(process.env.PERCH_SENTINEL_FREEZE_MS ?? 5000);
/** How long writes go on after the old master resumes. */
const RESUMED_WRITES_MS = 2000;
/** Within this of the switch, writes through perch must land on the new master. */
const FOLLOW_MS = 5000;
const PASSWORD = 'master-secret';
const SENTINEL_PASSWORD = 'sentinel-secret';

test('sentinels, master frozen (SIGSTOP): writes land on the new master within 5 s of the switch, none are lost to the demoted one', { timeout: 20_000 + FREEZE_MS }, async (t) => {
  const set = await startSentinels(t, { password: PASSWORD, sentinelPassword: SENTINEL_PASSWORD, downAfterMs: 1000 });
  const upstream = await startUpstream(t, sampleProvider);
  const addresses = set.addresses.map((a) => `"${a}"`).join(', ');
  const redis = `{ sentinels: [${addresses}], name: ${MASTER_NAME}, password: ${PASSWORD}, sentinel_password: ${SENTINEL_PASSWORD}, prefix: "t:", command_timeout_ms: 200 }`;
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), `cache: { stale_seconds: 0, ttl_seconds: { user: 300 }, redis: ${redis} }`));
  await waitFor(() => perch.cache.redisConnected === true, 10_000);

  // One new key at a time, each request's start time kept: which of them reach the final master
  // says when perch followed the switch and whether anything was written to the old master.
  const started = new Map<string, number>();
  let writing = true;
  onCleanup(t, () => (writing = false));
  const writer = (async () => {
    for (let i = 1; writing; i++) {
      const path = `/v1/users/${i}`;
      started.set(path, Date.now());
      assert.equal((await perch.request(path)).status, 200);
      await sleep(20);
    }
  })();
  await waitFor(() => started.size >= 5);

  set.master.freeze();
  const frozenAt = Date.now();
  const newMasterPort = await pollFor(async () => {
    const port = await set.masterPort().catch(() => undefined);
    return port === set.master.port ? undefined : port;
  }, FREEZE_MS, 50);
  const switchedAt = Date.now();
  assert.equal(newMasterPort, set.replica.port);
  // Part of the fault: the old master stays frozen for the whole freeze, then resumes.
  await sleep(frozenAt + FREEZE_MS - Date.now());
  set.master.thaw();
  const resumedAt = Date.now();
  // The sentinels demote the old master only some 8 s after it is back; until then it takes
  // writes, which its demotion then throws away. Writes it took would be missing from the new
  // master, so a few seconds of writes after the resume show whether perch still talks to it.
  await waitFor(() => [...started.values()].some((at) => at > resumedAt + RESUMED_WRITES_MS), RESUMED_WRITES_MS + 5000);
  writing = false;
  await writer;

  const keysOn = async (port: number) =>
    new Set((await set.cli(port, '--scan', '--pattern', 't:c:/v1/users/[0-9]*')).split('\n').map((key) => key.slice('t:c:'.length)));
  // Not demoted yet: what the old master holds now is what it was given.
  const [onNewMaster, onOldMaster] = await Promise.all([keysOn(newMasterPort), keysOn(set.master.port)]);
  const afterSwitch = [...started].filter(([, at]) => at >= switchedAt);
  const firstLanded = afterSwitch.find(([path]) => onNewMaster.has(path));
  assert.ok(firstLanded !== undefined, 'nothing written after the switch reached the new master');
  const followMs = firstLanded[1] - switchedAt;
  // From FOLLOW_MS after the switch on, every write reaches the final master: none went to the
  // frozen one, nor to the old master once it resumed, before or after its demotion.
  const lost = afterSwitch.filter(([path, at]) => at >= switchedAt + FOLLOW_MS && !onNewMaster.has(path)).map(([path]) => path);
  const afterResume = afterSwitch.filter(([, at]) => at >= resumedAt);
  t.diagnostic(
    `switch ${switchedAt - frozenAt} ms into the freeze; first write on the new master ${followMs} ms after it; ` +
      `resumed ${resumedAt - frozenAt} ms into it; ` +
      `of ${afterResume.length} keys written after the resume, ${afterResume.filter(([path]) => onNewMaster.has(path)).length} on the new master, ` +
      `${afterResume.filter(([path]) => onOldMaster.has(path)).length} on the old one`,
  );
  assert.ok(followMs <= FOLLOW_MS, `first write on the new master ${followMs} ms after the switch`);
  assert.deepEqual(lost, []);
  assert.deepEqual(afterResume.filter(([path]) => onOldMaster.has(path)), [], 'written to the old master after it resumed');
  assert.ok(afterResume.length > 0);
});
