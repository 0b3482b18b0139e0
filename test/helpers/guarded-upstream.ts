import type { TestContext } from 'node:test';
import { ManualClock } from './clock.js';
import { startPerch, testConfig, v1 } from './perch.js';
import { json, sampleProvider, startUpstream, type UpstreamBehaviour } from './upstream-server.js';

/** perch on one `v1` upstream answering with `behaviour`, its clock and timers in the test's hand. */
export async function guardedUpstream(t: TestContext, behaviour: UpstreamBehaviour, extra = '', routes = '') {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, behaviour);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, extra), routes), { clock, timers: clock });
  return { clock, upstream, perch };
}

/** Answers 429 with `headers` (and `body`) on the first call, the sample body after. */
export function limitedOnce(headers: Record<string, string>, body: unknown = {}): UpstreamBehaviour {
  let calls = 0;
  return (req, res) => (calls++ === 0 ? json(429, body, headers)(req, res) : sampleProvider(req, res));
}
