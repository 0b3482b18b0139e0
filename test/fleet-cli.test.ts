import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { RunEvent } from '../fleet/history.js';
import { onCleanup } from './helpers/cleanup.js';
import { tempDir } from './helpers/temp-dir.js';

// The fleet checker's command line (`npm run fleet`): help, and every bad word refused with one
// line and the usage before anything starts. None of these runs a fleet: a bad value that got
// through would print `fleet: seed …` and start one, which the asserts below would see.

const MAIN = fileURLToPath(new URL('../fleet/main.js', import.meta.url));

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the checker to its exit; killed if the test ends first. */
function run(t: TestContext, args: string[]): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [MAIN, ...args], { env: { PATH: process.env.PATH } });
    onCleanup(t, () => void child.kill('SIGKILL'));
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

const OPTIONS = ['--seed', '--seconds', '--instances', '--perch', '--out', '--known-open', '--check', '--help'];

for (const flag of ['--help', '-h']) {
  test(`${flag}: the usage on stdout, every option in it, exit 0`, { timeout: 20_000 }, async (t) => {
    const { code, stdout, stderr } = await run(t, [flag]);
    assert.equal(code, 0);
    assert.equal(stderr, '');
    assert.match(stdout, /^usage: npm run fleet -- \[options\]/);
    for (const option of OPTIONS) assert.ok(stdout.includes(option), `${option} in the usage`);
  });
}

const BAD: readonly { args: string[]; error: RegExp }[] = [
  { args: ['--seconds', 'abc'], error: /^fleet: --seconds takes a number of seconds more than 0, not "abc"$/ },
  { args: ['--seconds', '0'], error: /^fleet: --seconds takes a number of seconds more than 0, not "0"$/ },
  { args: ['--seconds=-5'], error: /^fleet: --seconds takes a number of seconds more than 0, not "-5"$/ },
  { args: ['--seconds', '-5'], error: /^fleet: Option '--seconds' argument is ambiguous\.$/ },
  { args: ['--instances', '0'], error: /^fleet: --instances takes a whole number from 1 to 64, not "0"$/ },
  { args: ['--instances', '2.5'], error: /^fleet: --instances takes a whole number/ },
  { args: ['--instances', '65'], error: /^fleet: --instances takes a whole number from 1 to 64, not "65"$/ },
  { args: ['--seed', 'x1'], error: /^fleet: --seed takes a whole number from 0 to 4294967295, not "x1"$/ },
  { args: ['--seed', '4294967296'], error: /^fleet: --seed takes a whole number/ },
  { args: ['--known-open', 'maybe'], error: /^fleet: --known-open takes report or fail, not "maybe"$/ },
  { args: ['--check', '/no/such/file'], error: /^fleet: --check: no such file: \/no\/such\/file$/ },
  { args: ['--check', '/no/such/file', '--seed', '1'], error: /^fleet: --check reads a recorded history: --seed would run a fleet$/ },
  { args: ['--perch', '/no/such/checkout'], error: /^fleet: --perch: no dist\/src\/main\.js under \/no\/such\/checkout/ },
  { args: ['--bogus'], error: /^fleet: Unknown option '--bogus'/ },
  { args: ['--seed'], error: /^fleet: Option '--seed <value>' argument missing$/ },
  { args: ['seed=1'], error: /^fleet: Unexpected argument 'seed=1'/ },
];

for (const { args, error } of BAD) {
  test(`${args.join(' ')}: one line saying what is wrong, the usage, exit 2, no fleet`, { timeout: 20_000 }, async (t) => {
    const { code, stdout, stderr } = await run(t, args);
    assert.equal(code, 2);
    assert.equal(stdout, '', 'nothing started');
    const [first, ...rest] = stderr.split('\n');
    assert.match(first!, error);
    assert.match(rest.join('\n'), /^usage: npm run fleet/);
    assert.doesNotMatch(stderr, /^\s+at /m, 'no stack trace');
  });
}

test('--check on a file that is no history: one line, exit 2', { timeout: 20_000 }, async (t) => {
  const path = join(tempDir(t, 'perch-fleet-cli-'), 'not-a-history.jsonl');
  writeFileSync(path, 'not json\n');
  const { code, stdout, stderr } = await run(t, ['--check', path]);
  assert.equal(code, 2);
  assert.equal(stdout, '');
  assert.equal(stderr.trimEnd().split('\n').length, 1, stderr);
  assert.match(stderr, new RegExp(`^fleet: cannot check ${path}: `));
});

test('--check on a recorded history checks it and starts nothing', { timeout: 20_000 }, async (t) => {
  const run0: RunEvent = {
    t: 'run',
    seed: 7,
    instances: 2,
    workers: 0,
    perch: '.',
    passThrough: false,
    batch: false,
    caps: { rate: 2, maxConcurrent: 2, quota: { requests: 5, perSeconds: 10 }, downShare: 0.5 },
    plans: { small: { capacity: 3, refill: 1 } },
    keys: { alpha: 'small' },
    ttl: 2,
    staleSeconds: 3,
    missDeadlineMs: 2000,
    graceMs: 1000,
    budgetPrefix: '/v1/users/77',
  };
  const path = join(tempDir(t, 'perch-fleet-cli-'), 'fleet-7.jsonl');
  writeFileSync(path, `${JSON.stringify(run0)}\n`);
  const { code, stdout, stderr } = await run(t, ['--check', path, '--known-open', 'fail']);
  assert.equal(stderr, '');
  assert.equal(code, 0, stdout);
  assert.doesNotMatch(stdout, /^fleet: seed 7, /m, 'no fleet started');
  assert.match(stdout, /^fleet: 0 requests, 0 provider calls, \d+ invariants checked$/m);
  assert.match(stdout, /^fleet: seed 7: pass /m);
});
