import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Clock } from '../src/clock.js';
import { startPerch, testConfig, v1 } from './helpers/perch.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

const E500 = '{"error":{"message":"Internal server error","code":"E500"}}';

/** A clock that works until told to fail: the injected stand-in for a bug inside perch. */
class BreakableClock implements Clock {
  broken = false;
  now(): number {
    if (this.broken) throw new Error('clock exploded: secret internals');
    return Date.now();
  }
}

test('a bug on the synchronous path is 500 E500 with no stack trace; the stack goes to the log', async (t) => {
  const clock = new BreakableClock();
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)), { clock });
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  clock.broken = true;
  const res = await perch.request('/v1/users/1');
  assert.equal(res.status, 500);
  assert.equal(res.text, E500);
  const logged = perch.logs.lines().find((l) => l.msg === 'unhandled error while serving a request');
  assert.match(String((logged?.err as { stack?: string })?.stack), /clock exploded/);
  assert.equal(perch.logs.lines().filter((l) => l.msg === 'request').at(-1)!.status, 500);
});

test('a bug after the upstream answered is 500 E500 for the leader and every coalesced waiter, and perch keeps serving', async (t) => {
  const clock = new BreakableClock();
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const upstream = await startUpstream(t, (req, res) => void gate.then(() => sampleProvider(req, res)));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)), { clock });
  const pending = Array.from({ length: 3 }, () => perch.request('/v1/tweets/5'));
  while (perch.received() < 3) await new Promise((r) => setTimeout(r, 5));
  clock.broken = true;
  release();
  const results = await Promise.all(pending);
  assert.deepEqual(results.map((r) => [r.status, r.text]), Array(3).fill([500, E500]));
  clock.broken = false;
  assert.equal((await perch.request('/v1/tweets/5')).status, 200);
});
