#!/usr/bin/env node
// Checks that the open-loop generator (lib/open-loop.mjs) sees what it exists to see:
// `npm run open-loop-check` drives a server that blocks its event loop 50 ms once a second
// (lib/servers/stall.mjs) and the same server without the stall, at a fixed rate. With 5% of the
// time stalled, 5% of the requests fall due during a stall and wait up to 50 ms, so the open-loop
// p99 must be tens of milliseconds (about 0.8 x the stall). wrk against the stalling server at
// saturation is printed for comparison: only 64 of its requests are held back per stall, and its
// p99 shows the stall because of the synthetic samples wrk adds after the run (see
// lib/open-loop.mjs). Exits 1 when the open-loop p99 does not show the stall. CHECK_RATE (5000),
// CHECK_DURATION_S (5), STALL_MS (50), BENCH_SERVER_CPU (0), BENCH_CLIENT_CPU (1).
import { openLoop } from './lib/open-loop.mjs';
import { installCleanup, pinning, pinSelf, start, waitForLine } from './lib/procs.mjs';
import { wrk } from './lib/wrk.mjs';

const rate = Number(process.env.CHECK_RATE ?? 5000);
const durationS = Number(process.env.CHECK_DURATION_S ?? 5);
const stallMs = Number(process.env.STALL_MS ?? 50);
const pin = pinning({ serverCpu: Number(process.env.BENCH_SERVER_CPU ?? 0), clientCpu: Number(process.env.BENCH_CLIENT_CPU ?? 1) });
installCleanup();
pinSelf(pin.clientCpu);
const path = '/v1/users/1000000000000000001/tweets';
const server = new URL('./lib/servers/stall.mjs', import.meta.url).pathname;

async function withServer(stall, fn) {
  const proc = start(`stall-${stall}`, process.execPath, [server], { cpu: pin.serverCpu, env: { ...process.env, STALL_MS: String(stall) } });
  try {
    const [, port] = await waitForLine(proc, /^LISTENING (\d+)$/);
    return await fn(`http://127.0.0.1:${port}`, proc.pid);
  } finally {
    await proc.stop();
  }
}

const ms = (v) => v.toFixed(3).padStart(8);
const line = (name, r) =>
  `${name.padEnd(34)} ${r.rps.toFixed(0).padStart(6)}/s  p50 ${ms(r.p50)}  p99 ${ms(r.p99)}  p99.9 ${ms(r.p999)}  max ${r.max === undefined ? '       -' : ms(r.max)}  generator CPU ${r.generatorCpu.toFixed(2)}  server CPU ${r.serverCpu.toFixed(2)}${r.lagP99 === undefined ? '' : `  send lag p99 ${r.lagP99.toFixed(3)}`}`;
const drive = (url, pid) => openLoop({ url, path, rate, durationS, cpu: pin.clientCpu, serverCpu: pin.serverCpu, serverPids: [pid] });

process.stdout.write(`open loop at ${rate}/s for ${durationS} s, 64 connections; ${pin.note}\n`);
const calm = await withServer(0, drive);
process.stdout.write(`${line('open loop, no stall', calm)}\n`);
const { stalled, closed } = await withServer(stallMs, async (url, pid) => ({
  stalled: await drive(url, pid),
  closed: await wrk({ url, path, connections: 64, durationS, cpu: pin.clientCpu, serverCpu: pin.serverCpu, serverPids: [pid] }),
}));
process.stdout.write(`${line(`open loop, ${stallMs} ms stall each second`, stalled)}\n${line('wrk at saturation, same stall', closed)}\n`);
// 5% of requests due in a stall wait 0-50 ms each, so the p99 is near 0.8 x the stall.
const shows = stalled.p99 >= stallMs / 2;
process.stdout.write(shows ? `ok: the stall is in the open-loop p99\n` : `FAIL: the open-loop p99 ${stalled.p99.toFixed(3)} ms does not show a ${stallMs} ms stall\n`);
process.exitCode = shows ? 0 : 1;
