import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { test, type TestContext } from 'node:test';
import { onCleanup } from './helpers/cleanup.js';
import { KEY } from './helpers/perch.js';
import { leakedFragments } from './helpers/secret-scan.js';

/** A stand-in for node:test's context that collects `after` hooks, to run them as node:test would. */
function hookCollector(): { t: TestContext; runHooks: () => Promise<void> } {
  const hooks: (() => unknown)[] = [];
  const t = { after: (fn: () => unknown) => void hooks.push(fn) } as unknown as TestContext;
  return {
    t,
    async runHooks() {
      for (const hook of hooks) await hook();
    },
  };
}

test('the secret scan finds any fragment of a key in a log, but not UUID-alphabet runs a request id holds by chance', { timeout: 5000 }, () => {
  assert.deepEqual(leakedFragments(`{"msg":"refused","key":"${KEY.slice(5, 15)}"}`, [KEY]), ['key-al', 'ey-alp', 'y-alph', '-alpha', 'alpha-']);
  // The fragments of KEY a CI run reported: every character of them can stand in a UUID.
  assert.deepEqual(leakedFragments('{"req_id":"3f0c9e4e-1b2d-4c5e-8f3a-01234b5c6d7e"}', [KEY]), []);
  assert.throws(() => leakedFragments('', ['0123-abcd-4567']), /needs letters beyond a-f/);
});

test('onCleanup runs its steps last registered first, every one even when one throws, and throws the first failure', { timeout: 5000 }, async () => {
  const { t, runHooks } = hookCollector();
  const ran: string[] = [];
  onCleanup(t, () => ran.push('first'));
  onCleanup(t, () => {
    ran.push('second');
    throw new Error('second failed');
  });
  onCleanup(t, () => {
    ran.push('third');
    throw new Error('third failed');
  });
  await assert.rejects(runHooks(), /third failed/);
  assert.deepEqual(ran, ['third', 'second', 'first']);
});

test('tests clean up through onCleanup only: a t.after hook after a failing one would never run', { timeout: 5000 }, () => {
  // node:test stops running a test's after hooks at the first that throws; onCleanup's hook throws
  // when a log holds a secret, and a browser closed by a plain t.after then kept the file alive.
  const root = new URL('../../test/', import.meta.url);
  const files = readdirSync(root, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.ts') && f !== 'helpers/cleanup.ts');
  assert.ok(files.length > 50, `found ${files.length} test sources`);
  const offenders = files.filter((f) => /\bt\.after\(/.test(readFileSync(new URL(f, root), 'utf8')));
  assert.deepEqual(offenders, []);
});
