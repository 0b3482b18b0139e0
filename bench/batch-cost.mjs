// What the batch layer costs a lone miss, without HTTP: one attempt at a time through the layer
// (batching on) and through no layer, to a provider that answers at once. Interleaved rounds;
// prints the median time per attempt of each and their difference. `node bench/batch-cost.mjs`
// after `npm run build` at the root.
import { createBatching } from '../dist/src/upstream/batch.js';
import { NO_EVENTS } from '../dist/src/upstream/events.js';
import { systemTimers } from '../dist/src/timers.js';

const N = Number(process.env.BATCH_COST_N ?? 50_000);
const ROUNDS = 5;
const answer = { kind: 'ok', body: Buffer.from('{}') };
const provider = async (attempt) => {
  attempt.batch?.seal();
  return answer;
};
const batched = createBatching({ upstream: 'x', config: { enabled: true, max_items: 100, window_ms: 0 }, queueTimeoutMs: 1000, queueSize: 1000, timers: systemTimers, events: NO_EVENTS })(provider);
const attempt = (i) => ({ request: { endpoint: 'user', params: { user_id: String(i) }, path: `/v1/users/${i}` }, deadline: performance.now() + 10_000, payer: { id: 'k', weight: 1, label: 'k' } });

async function run(call) {
  const t = performance.now();
  for (let i = 0; i < N; i++) await call(attempt(i));
  return ((performance.now() - t) * 1000) / N;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
await run(batched);
await run(provider);
const on = [];
const off = [];
for (let r = 0; r < ROUNDS; r++) {
  if (r % 2 === 0) {
    on.push(await run(batched));
    off.push(await run(provider));
  } else {
    off.push(await run(provider));
    on.push(await run(batched));
  }
}
console.log(`per lone attempt, median of ${ROUNDS} rounds of ${N}: batch layer ${median(on).toFixed(2)} µs, no layer ${median(off).toFixed(2)} µs, the layer's cost ${(median(on) - median(off)).toFixed(2)} µs`);
