import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import type { TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import { onCleanup } from './cleanup.js';
import { waitFor } from './perch.js';
import { leakedFragments, secretsOf } from './secret-scan.js';

/** The built entry point, `perch` as an operator runs it. */
export const MAIN = fileURLToPath(new URL('../../src/main.js', import.meta.url));

export interface PerchProcess {
  readonly process: ChildProcess;
  /** The base URL from `perch is up on <url>`. */
  readonly url: string;
  /** Resolves with the exit code and signal once the process has exited. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** stdout so far: JSON log lines only. */
  stdout(): string;
  /** stdout and stderr so far, interleaved as they arrived. */
  output(): string;
}

/**
 * Starts `node dist/src/main.js --config <path> [args]` as a real child process, so signals are
 * real signals, and waits for `perch is up on <url>`. Killed (SIGKILL) and awaited when the test
 * ends.
 */
export async function spawnPerch(t: TestContext, configPath: string, env: NodeJS.ProcessEnv = {}, args: readonly string[] = []): Promise<PerchProcess> {
  const child = spawn(process.execPath, [MAIN, '--config', configPath, ...args], { env: { PATH: process.env.PATH, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  // The log (stdout) must hold no fragment of a configured secret; stderr's hint for the person
  // at the terminal is not a log.
  const secrets = secretsOf(readFileSync(configPath, 'utf8'), env);
  onCleanup(t, () => {
    const leaks = leakedFragments(stdout, secrets);
    if (leaks.length > 0) throw new Error(`secret fragments in the log: ${leaks.join(', ')}`);
  });
  onCleanup(t, async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  });
  let stdout = '';
  let output = '';
  child.stdout.on('data', (d: Buffer) => {
    stdout += d.toString();
    output += d.toString();
  });
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  await waitFor(() => /perch is up on (\S+)\n/.test(output) || child.exitCode !== null, 10_000);
  const url = /perch is up on (\S+)\n/.exec(output)?.[1];
  assert.ok(url !== undefined, `perch did not start:\n${output}`);
  return { process: child, url, exited, stdout: () => stdout, output: () => output };
}

export interface CliRun {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `perch <args>` to its exit; killed if the test ends first. */
export function runCli(t: TestContext, args: readonly string[], env: NodeJS.ProcessEnv = {}): Promise<CliRun> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [MAIN, ...args], { env: { PATH: process.env.PATH, ...env } });
    const closed = new Promise<void>((r) => child.on('close', () => r()));
    onCleanup(t, async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await closed;
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** A TCP port nothing listens on now on `host`: bound on 0, then released. */
export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, host, () => {
      const { port } = server.address() as AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** Whether this machine can listen on the IPv6 loopback `::1`. */
export function hasIpv6Loopback(): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(0, '::1', () => server.close(() => resolve(true)));
  });
}

/** Resolves with `promise`, or fails once `ms` have passed without it settling. */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  try {
    return await Promise.race([promise, expired]);
  } finally {
    clearTimeout(timer);
  }
}
