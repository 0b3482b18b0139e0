// The bench's own node:http servers (upstream stand-in, ceiling), each a pinned child process.
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { request } from 'undici';
import { start, waitForLine } from './procs.mjs';

const script = (name) => fileURLToPath(new URL(`./servers/${name}.mjs`, import.meta.url));

async function startScript(ctx, name, env = {}, { ownSession = false, node = process.execPath } = {}) {
  const proc = start(name, node, [script(name)], { cpu: ctx.pin.serverCpu, env: { ...process.env, ...env }, ownSession });
  const [, port] = await waitForLine(proc, /^LISTENING (\d+)$/);
  return { proc, port: Number(port), url: `http://127.0.0.1:${port}` };
}

/** The v1 provider stand-in, with request counters for the economy figure. */
export async function startUpstream(ctx) {
  const upstream = await startScript(ctx, 'upstream');
  return {
    ...upstream,
    async stats() {
      const res = await request(`${upstream.url}/__bench/stats`);
      return res.body.json();
    },
    async reset() {
      const res = await request(`${upstream.url}/__bench/reset`, { method: 'POST' });
      return res.body.json();
    },
  };
}

/** perch's API listener around the ceiling's fixed answer (see servers/perch-shell.mjs). */
export function startPerchShell(ctx, userId) {
  return startScript(ctx, 'perch-shell', { HIT_USER_ID: userId, PERCH_ROOT: ctx.repoRoot });
}

/** A miss's work done plainly on node:http and undici, up to `work` (hop, parse or compress: see servers/plain-miss.mjs). */
export function startPlainMiss(ctx, upstreamUrl, work) {
  return startScript(ctx, 'plain-miss', { UPSTREAM: upstreamUrl, MISS_WORK: work, PERCH_ROOT: ctx.repoRoot });
}

/** A cache done plainly on `node` with Node's defaults: bodies as Buffers in a Map, up to `maxBytes` (see servers/plain-cache.mjs). */
export function startPlainCache(ctx, upstreamUrl, maxBytes, node) {
  return startScript(ctx, 'plain-cache', { UPSTREAM: upstreamUrl, MAX_BYTES: String(maxBytes) }, { node });
}

/** The hit path's work done plainly on bare node:http (see servers/minimal-path.mjs). */
export function startMinimalPath(ctx, userId, { ownSession = false, logName = 'minimal-path' } = {}) {
  const logFile = ctx.options.logToFile ? join(ctx.tmpDir, `${logName}.log`) : '/dev/null';
  return startScript(ctx, 'minimal-path', { HIT_USER_ID: userId, PERCH_ROOT: ctx.repoRoot, LOG_FILE: logFile }, { ownSession });
}

/** The same work on a bare socket, without node:http (see servers/raw-path.mjs). */
export function startRawPath(ctx, userId) {
  const logFile = ctx.options.logToFile ? join(ctx.tmpDir, 'raw-path.log') : '/dev/null';
  return startScript(ctx, 'raw-path', { HIT_USER_ID: userId, PERCH_ROOT: ctx.repoRoot, LOG_FILE: logFile });
}

/** The bare node:http ceiling serving the hit page for `userId`. */
export function startCeiling(ctx, userId) {
  return startScript(ctx, 'ceiling', { HIT_USER_ID: userId });
}
