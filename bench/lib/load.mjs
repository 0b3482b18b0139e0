// Load generation for fixed request lists (upstream economy, cache fill): a small loop of N
// concurrent workers over an undici Pool. Those figures depend on every listed request being
// issued exactly once, in a known order, and answered 200; a loop makes that explicit and
// checkable. Throughput is not what these scenarios measure: fixed-duration throughput and
// latency runs use wrk (wrk.mjs).
import { Pool } from 'undici';

/**
 * Issues `count` GETs, request i to `targets[i % targets.length]` + `pathOf(i)`, with
 * `concurrency` workers each taking the next index when its previous request is done. Bounded
 * by `deadlineMs`. Returns counts by status and the first error.
 */
export async function issueAll({ targets, count, pathOf, headers = {}, concurrency, deadlineMs }) {
  const pools = targets.map((url) => new Pool(url, { connections: concurrency, pipelining: 1, headersTimeout: 10_000, bodyTimeout: 10_000 }));
  const statuses = new Map();
  let next = 0;
  let errors = 0;
  let firstError;
  const deadline = Date.now() + deadlineMs;
  const t0 = performance.now();
  async function worker() {
    for (;;) {
      const i = next++;
      if (i >= count || Date.now() > deadline) return;
      const pool = pools[i % pools.length];
      try {
        const res = await pool.request({ path: pathOf(i), method: 'GET', headers });
        await res.body.dump({ limit: 1 << 20 });
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
      } catch (error) {
        errors++;
        firstError ??= error;
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: concurrency }, worker));
  } finally {
    await Promise.all(pools.map((pool) => pool.close()));
  }
  const issued = Math.min(next, count);
  return {
    issued,
    completed: issued === count,
    ok: statuses.get(200) ?? 0,
    statuses: Object.fromEntries(statuses),
    errors,
    firstError: firstError === undefined ? undefined : String(firstError?.message ?? firstError),
    seconds: (performance.now() - t0) / 1000,
  };
}

/**
 * Open loop: request i goes out at `i / ratePerSecond` seconds after the start, whether or not
 * earlier ones have their answer (no coordinated omission), for `seconds`, with `headers`, or
 * `headersOf(i)` when given (say, client keys taken in turn). Returns each
 * request's send time (ms after the start), status (0 for a transport error) and time to its
 * answer (ms), in order.
 */
export async function issueAtRate({ target, ratePerSecond, seconds, pathOf, headers = {}, headersOf }) {
  const pool = new Pool(target, { connections: 256, pipelining: 1, headersTimeout: 10_000, bodyTimeout: 10_000 });
  const count = Math.round(ratePerSecond * seconds);
  const results = new Array(count);
  const t0 = performance.now();
  const pending = [];
  try {
    for (let i = 0; i < count; i++) {
      const due = t0 + (i * 1000) / ratePerSecond;
      const wait = due - performance.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      const sentAt = performance.now() - t0;
      pending.push(
        pool.request({ path: pathOf(i), method: 'GET', headers: headersOf ? headersOf(i) : headers }).then(
          async (res) => {
            await res.body.dump({ limit: 1 << 20 });
            results[i] = { sentAt, status: res.statusCode, ms: performance.now() - t0 - sentAt };
          },
          () => (results[i] = { sentAt, status: 0, ms: performance.now() - t0 - sentAt }),
        ),
      );
    }
    await Promise.all(pending);
  } finally {
    await pool.close();
  }
  return results;
}
