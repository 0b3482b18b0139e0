// What a bench tool run on its own (not from run.mjs) sets up first: cleanup of its children on
// exit, a built perch, its own process pinned to the client CPU, a temp dir removed at exit, and
// the ctx the scenarios' helpers take.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureBuilt, metricsSection } from './perch.mjs';
import { installCleanup, pinning, pinSelf } from './procs.mjs';

/**
 * The perch checkout the bench measures: BENCH_PERCH_ROOT (another built checkout, to compare
 * builds), else the repository around bench/.
 */
export function perchRoot(env = process.env) {
  return env.BENCH_PERCH_ROOT ? resolve(env.BENCH_PERCH_ROOT) : dirname(dirname(dirname(fileURLToPath(import.meta.url))));
}

/** The ctx for perch at `repoRoot`, logging to files in a new temp dir named from `tmpPrefix`. */
export function standaloneContext({ repoRoot, tmpPrefix }) {
  installCleanup();
  const perchMain = join(repoRoot, 'dist', 'src', 'main.js');
  ensureBuilt(repoRoot, perchMain);
  const pin = pinning({ serverCpu: 0, clientCpu: 1 });
  pinSelf(pin.clientCpu);
  const tmpDir = mkdtempSync(join(os.tmpdir(), tmpPrefix));
  process.on('exit', () => rmSync(tmpDir, { recursive: true, force: true }));
  const ctx = { options: { logToFile: true }, pin, tmpDir, repoRoot, perchMain, log: console.error };
  ctx.metricsYaml = metricsSection(ctx);
  return ctx;
}
