// Hit path: perch serving one cached ~10 KB tweets page vs the bare node:http ceiling (and nginx
// proxy_cache when nginx is on PATH), `connections` keep-alive connections, fixed duration runs
// interleaved target by target so drift hits every target alike.
import { get, hasMetrics, BENCH_KEY, startPerch } from '../lib/perch.mjs';
import { nginxVersion, startNginx } from '../lib/nginx.mjs';
import { cannon } from '../lib/load.mjs';
import { startCeiling, startUpstream } from '../lib/servers.mjs';
import { median } from '../lib/stats.mjs';

export const HIT_USER_ID = '1000000000000000001';
export const HIT_PATH = `/v1/users/${HIT_USER_ID}/tweets`;

export async function hitScenario(ctx) {
  const { options } = ctx;
  const notes = [];
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const ceiling = await startCeiling(ctx, HIT_USER_ID);
    stops.push(ceiling.proc);
    const perch = await startPerch(ctx, 'perch-hit', { upstreamUrl: upstream.url, ttl: { tweets: 3600 } });
    stops.push(perch.proc);

    // Prime the cache and check the measured responses are what they claim to be.
    const first = await get(perch.url, HIT_PATH);
    const hit = await get(perch.url, HIT_PATH);
    if (first.status !== 200 || hit.status !== 200) throw new Error(`perch answered ${first.status}/${hit.status} on the hit path`);
    if (!String(hit.headers['cache-status']).startsWith('perch; hit')) throw new Error(`second request is not a hit: cache-status ${hit.headers['cache-status']}`);
    const direct = await get(ceiling.url, HIT_PATH);
    if (!direct.body.equals(hit.body)) throw new Error('the ceiling does not serve the same bytes as perch');
    const headerCount = (h) => Object.keys(h).length;
    notes.push(
      `Hit page: ${hit.body.length} bytes. Response headers: perch ${headerCount(hit.headers)}, ceiling ${headerCount(direct.headers)}.`,
    );
    ctx.metricsPresent = await hasMetrics(perch.url);

    const targets = [
      { name: 'ceiling', url: ceiling.url, pids: [ceiling.proc.pid] },
      { name: 'perch', url: perch.url, pids: [perch.proc.pid] },
    ];
    const nginx = nginxVersion();
    if (nginx === null) {
      notes.push('nginx proxy_cache: skipped, `nginx` is not on PATH (bench/lib/nginx.mjs generates its config where it is).');
    } else {
      try {
        const ng = await startNginx(ctx, upstream.port);
        stops.push(ng.proc);
        await get(ng.url, HIT_PATH);
        const ngHit = await get(ng.url, HIT_PATH);
        if (!String(ngHit.headers['cache-status']).includes('HIT')) throw new Error(`nginx second request not a HIT: ${ngHit.headers['cache-status']}`);
        targets.push({ name: 'nginx', url: ng.url, pids: [ng.proc.pid] });
        notes.push(`nginx proxy_cache: ${nginx}, one worker process, cache on disk in a temp dir (page cache).`);
      } catch (error) {
        notes.push(`nginx proxy_cache: not measured, ${error.message}`);
      }
    }

    const run = (t, durationS) =>
      cannon({ url: t.url, path: HIT_PATH, headers: { 'x-api-key': BENCH_KEY }, connections: options.connections, durationS, serverPids: t.pids });
    for (const t of targets) await run(t, options.warmupS);
    const results = Object.fromEntries(targets.map((t) => [t.name, []]));
    for (let r = 0; r < options.runs; r++) {
      for (const t of targets) {
        const result = await run(t, options.durationS);
        if (result.non2xx > 0 || result.errors > 0) notes.push(`${t.name} run ${r + 1}: ${result.non2xx} non-2xx, ${result.errors} errors`);
        results[t.name].push(result);
        ctx.log(`  hit ${t.name} run ${r + 1}: ${result.rps.toFixed(0)} req/s, p50 ${result.p50.toFixed(2)} ms, p99 ${result.p99.toFixed(2)} ms, server CPU ${pct(result.serverCpu)}, load generator CPU ${pct(result.loadgenCpu)}`);
      }
    }

    const series = (name, field) => results[name].map((r) => r[field]);
    const med = (name, field) => median(series(name, field));
    const loadgenBound = targets.filter((t) => med(t.name, 'loadgenCpu') > 0.9 && med(t.name, 'serverCpu') < 0.9);
    if (loadgenBound.length > 0) {
      notes.push(`Load generator saturated its CPU before the server did for: ${loadgenBound.map((t) => t.name).join(', ')}; those throughputs are a floor.`);
    }
    const starved = targets.filter((t) => med(t.name, 'loadgenCpu') < 0.9 && med(t.name, 'serverCpu') < 0.9);
    if (starved.length > 0) {
      notes.push(`Neither the server nor the load generator used 90% of its CPU for: ${starved.map((t) => t.name).join(', ')}. Something else was using the CPUs: those figures are unreliable.`);
    }
    notes.push(
      `Median CPU share during hit runs (1.00 = one core): ${targets.map((t) => `${t.name} server ${med(t.name, 'serverCpu').toFixed(2)} / load generator ${med(t.name, 'loadgenCpu').toFixed(2)}`).join('; ')}.`,
    );

    const figures = [
      {
        id: 'hit.rps',
        label: `hit throughput, ${options.connections} conns (req/s)`,
        runs: series('perch', 'rps'),
        baseline: { label: 'ceiling', runs: series('ceiling', 'rps') },
        target: { text: '>= 0.85x ceiling', pass: (v, b) => v >= 0.85 * b },
        decimals: 0,
      },
      {
        id: 'hit.p50',
        label: 'hit latency p50 (ms)',
        runs: series('perch', 'p50'),
        baseline: { label: 'ceiling', runs: series('ceiling', 'p50') },
        decimals: 2,
      },
      {
        id: 'hit.p99',
        label: 'hit latency p99 (ms)',
        runs: series('perch', 'p99'),
        baseline: { label: 'ceiling', runs: series('ceiling', 'p99') },
        target: { text: '<= 5 ms', pass: (v) => v <= 5 },
        decimals: 2,
      },
    ];
    if (results.nginx) {
      figures.push(
        { id: 'hit.nginx.rps', label: 'nginx proxy_cache throughput (req/s)', runs: series('nginx', 'rps'), baseline: { label: 'ceiling', runs: series('ceiling', 'rps') }, decimals: 0 },
        { id: 'hit.nginx.p99', label: 'nginx proxy_cache p99 (ms)', runs: series('nginx', 'p99'), baseline: { label: 'ceiling', runs: series('ceiling', 'p99') }, decimals: 2 },
        { id: 'hit.perch_vs_nginx', label: 'perch throughput vs nginx (req/s)', runs: series('perch', 'rps'), baseline: { label: 'nginx', runs: series('nginx', 'rps') }, decimals: 0 },
      );
    }
    return { figures, notes };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
}

const pct = (x) => `${(x * 100).toFixed(0)}%`;
