// A month's quota in the memory provider state, without HTTP: `quota: { requests: 1000000,
// per_seconds: 2678400 }`, one call admitted and answered per simulated 2 ms, a million calls
// in the window. Prints the heap the state holds (after GC) and the median time of an admission
// per 100,000 calls, and of a refusal at the quota. `node --expose-gc bench/quota-state.mjs`
// after `npm run build` at the root.
import { MemoryProviderState } from '../dist/src/upstream/guard/memory-state.js';
import { compileCap } from '../dist/src/upstream/guard/provider-state.js';

const CALLS = Number(process.env.QUOTA_STATE_CALLS ?? 1_000_000);
const gc = globalThis.gc;
if (gc === undefined) throw new Error('run with node --expose-gc');
const clock = { t: 1_800_000_000_000, now() { return this.t; } };
const cap = compileCap({ quota: { requests: CALLS, per_seconds: 2_678_400 } });
const payer = { id: 'k', weight: 1, label: 'k' };
const query = (i) => ({ upstream: 'main', scope: '*', candidates: ['default'], cap, localCap: cap, leaseId: `lease-${i}`, leaseMs: 5000, payer });
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const heap = () => {
  gc();
  return process.memoryUsage().heapUsed;
};

const state = new MemoryProviderState(clock);
let times = [];
const base = heap();
const rows = [];
for (let i = 0; i < CALLS; i++) {
  const q = query(i);
  const t = process.hrtime.bigint();
  const admission = state.admit(q);
  times.push(Number(process.hrtime.bigint() - t) / 1000);
  if (admission.kind !== 'admitted') throw new Error(`call ${i} refused: ${JSON.stringify(admission)}`);
  clock.t += 1;
  state.finish('main', q.leaseId);
  clock.t += 1;
  if ((i + 1) % (CALLS / 10) === 0) {
    const admission = median(times);
    times = [];
    rows.push({ calls: i + 1, 'admission median us': admission.toFixed(2), 'state heap MiB': ((heap() - base) / 2 ** 20).toFixed(2) });
  }
}
const refusals = [];
let refused;
for (let i = 0; i < 1000; i++) {
  const t = process.hrtime.bigint();
  refused = state.admit(query(CALLS + i));
  refusals.push(Number(process.hrtime.bigint() - t) / 1000);
}
console.table(rows);
console.log(`at the quota: ${JSON.stringify(refused)}, refusal median ${median(refusals).toFixed(2)} us`);
