import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Breaker } from '../src/redis/breaker.js';
import { insured, SwitchLog } from '../src/redis/insurance.js';
import { ManualClock } from './helpers/clock.js';
import { captureLogs } from './helpers/log-capture.js';

function setup() {
  const clock = new ManualClock();
  const logs = captureLogs();
  const breaker = new Breaker({ clock, logger: logs.logger, name: 'test redis', threshold: 2, coolDownMs: 1000 });
  const switches = new SwitchLog(logs.logger, { down: 'shared state lost', up: 'shared state back' });
  const switchLines = () => logs.lines().filter((l) => String(l.msg).startsWith('shared state')).map((l) => [l.level, l.msg, l.reason]);
  return { clock, breaker, switches, switchLines };
}

const down = () => Promise.reject(new Error('ECONNREFUSED'));

test('the shared answer while it comes; a failure is answered locally and moves the breaker', async () => {
  const { breaker, switches } = setup();
  assert.equal(await insured(breaker, async () => 'shared', () => 'local', switches), 'shared');
  assert.equal(await insured(breaker, down, () => 'local', switches), 'local');
  assert.equal(breaker.state, 'closed');
  assert.equal(await insured(breaker, down, () => 'local', switches), 'local');
  assert.equal(breaker.state, 'open');
});

test('while the breaker is open the local answer is synchronous and the shared path is not asked', async () => {
  const { clock, breaker } = setup();
  await insured(breaker, down, () => 0);
  await insured(breaker, down, () => 0);
  let asked = 0;
  let skipped = 0;
  const hooks = { failed: () => undefined, skipped: () => skipped++ };
  const answer = insured(breaker, async () => ++asked, () => -1, hooks);
  assert.equal(answer, -1, 'a plain value, not a promise');
  assert.equal(asked, 0);
  assert.equal(skipped, 1);
  clock.advance(1000);
  assert.equal(await insured(breaker, async () => ++asked, () => -1, hooks), 1, 'the probe after the cool-down');
  assert.equal(breaker.state, 'closed');
});

test('the switch is logged once each way, with the reason, however many calls fail', async () => {
  const { clock, breaker, switches, switchLines } = setup();
  for (let i = 0; i < 5; i++) await insured(breaker, down, () => 0, switches);
  assert.deepEqual(switchLines(), [[40, 'shared state lost', 'ECONNREFUSED']]);
  clock.advance(1000);
  await insured(breaker, async () => 1, () => 0, switches);
  await insured(breaker, async () => 1, () => 0, switches);
  assert.deepEqual(switchLines(), [
    [40, 'shared state lost', 'ECONNREFUSED'],
    [30, 'shared state back', undefined],
  ]);
});
