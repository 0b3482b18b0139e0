import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { chmodSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { tempDir } from './helpers/temp-dir.js';

const MINIMAL = `
auth:
  keys:
    - { id: alpha, key: "\${ALPHA_KEY:-alpha-secret-0123456789}", plan: small }
rate_limits:
  small: { capacity: 5, refill_per_second: 1 }
upstreams:
  demo: { kind: fixture }
`;

const T = { timeout: 10_000 };

function problemsOf(text: string, env: NodeJS.ProcessEnv = {}): readonly string[] {
  try {
    parseConfig(text, env);
  } catch (error) {
    assert.ok(error instanceof ConfigError, String(error));
    return error.problems;
  }
  assert.fail('expected the configuration to be rejected');
}

const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');

test('${file:...} reads a secret file, trimming one trailing newline, and names the key path, never the content, when it cannot', T, (t) => {
  const dir = tempDir(t, 'perch-secrets-');
  const secret = join(dir, 'alpha_key');
  writeFileSync(secret, 'file-secret-0123456789\n');
  const keyed = MINIMAL.replace('${ALPHA_KEY:-alpha-secret-0123456789}', `\${file:${secret}}`);
  assert.equal(parseConfig(keyed, {}).auth.keys[0]?.secrets[0]?.sha256, sha256('file-secret-0123456789'));

  // Only one newline goes: a second one is part of the value (and here makes it 17+ characters).
  writeFileSync(secret, 'file-secret-0123456789\n\n');
  assert.equal(parseConfig(keyed, {}).auth.keys[0]?.secrets[0]?.sha256, sha256('file-secret-0123456789\n'));
  writeFileSync(secret, 'file-secret-0123456789\r\n');
  assert.equal(parseConfig(keyed, {}).auth.keys[0]?.secrets[0]?.sha256, sha256('file-secret-0123456789'));

  // Inside a longer value, like an upstream header.
  writeFileSync(secret, 'provider-token\n');
  const header = `${MINIMAL}  main: { kind: v1, url: "https://provider.example", headers: { Authorization: "Bearer \${file:${secret}}" } }\n`;
  const main = parseConfig(header, {}).upstreams.main;
  assert.ok(main?.kind === 'v1');
  assert.deepEqual(main.credentials[0]?.headers, { Authorization: 'Bearer provider-token' });

  const missing = join(dir, 'absent');
  assert.deepEqual(problemsOf(keyed.replace(secret, missing)), [`auth.keys[0].key: cannot read file ${missing} (ENOENT)`]);
  assert.deepEqual(problemsOf(keyed.replace(secret, dir)), [`auth.keys[0].key: cannot read file ${dir} (EISDIR)`]);
  assert.deepEqual(problemsOf(keyed.replace(secret, 'relative/key')), ['auth.keys[0].key: ${file:...} needs an absolute path, got "relative/key"']);
  if (process.getuid?.() !== 0) {
    // root reads any file, so an unreadable one can only be made for other users.
    writeFileSync(secret, 'file-secret-0123456789');
    chmodSync(secret, 0o000);
    assert.deepEqual(problemsOf(keyed), [`auth.keys[0].key: cannot read file ${secret} (EACCES)`]);
  }
  // A file read for a value that fails validation: the message never carries the content.
  writeFileSync(secret, 'short-secret\n');
  chmodSync(secret, 0o600);
  const problems = problemsOf(keyed);
  assert.equal(problems.length, 1);
  assert.match(problems[0]!, /^auth\.keys\[0\]\.key: /);
  assert.ok(!problems[0]!.includes('short-secret'));
});

test('server.rate_limit_headers takes ietf and x_rate_limit, at least one, each once', T, () => {
  assert.deepEqual(parseConfig(MINIMAL, {}).server.rate_limit_headers, ['ietf']);
  const withHeaders = (list: string) => `${MINIMAL}server: { rate_limit_headers: ${list} }\n`;
  assert.deepEqual(parseConfig(withHeaders('[ietf, x_rate_limit]'), {}).server.rate_limit_headers, ['ietf', 'x_rate_limit']);
  assert.deepEqual(parseConfig(withHeaders('[x_rate_limit]'), {}).server.rate_limit_headers, ['x_rate_limit']);
  assert.deepEqual(problemsOf(withHeaders('[]')), ['server.rate_limit_headers: must be a non-empty list of ietf, x_rate_limit']);
  assert.deepEqual(problemsOf(withHeaders('ietf')), ['server.rate_limit_headers: must be a non-empty list of ietf, x_rate_limit']);
  assert.deepEqual(problemsOf(withHeaders('[ietf, twitter]')), ['server.rate_limit_headers[1]: must be one of ietf, x_rate_limit']);
  assert.deepEqual(problemsOf(withHeaders('[ietf, ietf]')), ['server.rate_limit_headers[1]: repeats ietf']);
});

test('log.time and log.level_format choose pino formats, with pino defaults', T, () => {
  assert.deepEqual(parseConfig(`${MINIMAL}log: { time: iso, level_format: label }\n`, {}).log, { level: 'info', time: 'iso', level_format: 'label' });
  assert.deepEqual(problemsOf(`${MINIMAL}log: { time: unix, level_format: 30 }\n`), [
    'log.time: must be one of epoch_ms, iso',
    'log.level_format: must be a string',
  ]);
  assert.deepEqual(problemsOf(`${MINIMAL}log: { level_format: name }\n`), ['log.level_format: must be one of number, label']);
});

test('a YAML error about an unclosed bracket or quote points at the line that opened it', T, () => {
  assert.deepEqual(problemsOf('rate_limits: { small: { capacity: 5 }\nupstreams:\n  demo: { kind: fixture }\n'), [
    'YAML syntax, line 1, column 14: Flow map in block collection must be sufficiently indented and end with a } (opened here, still open at line 2, column 1)',
  ]);
  assert.deepEqual(problemsOf('auth:\n  keys: [ { id: a, key: x, plan: p }\n\nrate_limits: {}\n'), [
    'YAML syntax, line 2, column 9: Flow sequence in block collection must be sufficiently indented and end with a ] (opened here, still open at line 4, column 1)',
  ]);
  assert.deepEqual(problemsOf('server:\n  host: "127.0.0.1\n  port: 8080\nlog: { level: info }\n'), [
    'YAML syntax, line 2, column 9: Missing closing "quote (opened here, still open at line 5, column 1)',
  ]);
  // Errors that are where the parser says keep their position.
  assert.deepEqual(problemsOf('server: { host: x }\nlog:\n  level: info\n level: warn\n'), [
    'YAML syntax, line 4, column 1: All mapping items must start at the same column',
  ]);
});
