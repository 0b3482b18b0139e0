import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { parseConfig } from '../src/config/load.js';
import { tempDir } from './helpers/temp-dir.js';

/**
 * No Docker engine runs in CI, so the image and compose file are checked as text against what
 * Docker and Compose document: what goes into the build context, what the image carries, and
 * the hardening of every perch service.
 */

const root = (path: string) => fileURLToPath(new URL(`../../${path}`, import.meta.url));
const read = (path: string) => readFileSync(root(path), 'utf8');
const T = { timeout: 10_000 };

test('.dockerignore sends only what the build stage copies', T, () => {
  const lines = read('.dockerignore')
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('#'));
  assert.deepEqual(lines, ['*', '!package.json', '!package-lock.json', '!tsconfig.json', '!src/', '!test/']);
  const copied = [...read('Dockerfile').matchAll(/^COPY (?!--from)(.+) \S+$/gm)].flatMap((m) => m[1]!.split(' '));
  // Files are named as they are; directories (src, test) with a trailing slash.
  for (const source of copied) assert.ok(lines.includes(source.includes('.') ? `!${source}` : `!${source}/`), `${source} is excluded from the context`);
});

test('the image bakes in no configuration, labels itself, and health-checks the configured listener', T, () => {
  const dockerfile = read('Dockerfile');
  assert.doesNotMatch(dockerfile, /config\/perch\.yaml/);
  assert.match(dockerfile, /^ENV PERCH_CONFIG=\/etc\/perch\/perch\.yaml$/m);
  assert.match(dockerfile, /^HEALTHCHECK .*CMD \["perch", "--health-check"\]$/m);
  for (const label of ['version', 'source', 'licenses']) assert.match(dockerfile, new RegExp(`org\\.opencontainers\\.image\\.${label}=`));
  const version = (JSON.parse(read('package.json')) as { version: string }).version;
  assert.match(dockerfile, new RegExp(`^ARG VERSION=${version.replaceAll('.', '\\.')}$`, 'm'));
  assert.match(dockerfile, /org\.opencontainers\.image\.licenses="MIT"/);
  // Both stages use the one pinned base.
  assert.deepEqual([...dockerfile.matchAll(/^FROM (\S+)/gm)].map((m) => m[1]), ['${NODE_IMAGE}', '${NODE_IMAGE}']);
});

test('compose runs perch read-only, without capabilities or privilege gain, with keys as Docker secrets', T, (t) => {
  const compose = parse(read('deploy/compose.yaml'), { merge: true }) as {
    services: Record<string, Record<string, unknown>>;
    secrets: Record<string, { file: string }>;
  };
  const perchServices = Object.entries(compose.services).filter(([name]) => name.startsWith('perch-'));
  assert.equal(perchServices.length, 2);
  for (const [name, service] of perchServices) {
    assert.equal(service.read_only, true, name);
    assert.deepEqual(service.cap_drop, ['ALL'], name);
    assert.deepEqual(service.security_opt, ['no-new-privileges:true'], name);
    assert.deepEqual(service.secrets, ['perch_alpha_key'], name);
    for (const variable of Object.keys((service.environment ?? {}) as object)) assert.doesNotMatch(variable, /KEY|SECRET|PASSWORD|TOKEN/, name);
  }
  assert.deepEqual(compose.secrets, { perch_alpha_key: { file: './secrets/perch_alpha_key' } });

  // The file the services mount reads every key from /run/secrets/ and validates.
  const config = read('deploy/perch.yaml');
  const keys = [...config.matchAll(/^[^#\n]*"\$\{file:\/run\/secrets\/(\w+)\}"/gm)].map((m) => m[1]);
  assert.deepEqual(keys, Object.keys(compose.secrets));
  assert.doesNotMatch(config.replace(/#.*$/gm, ''), /\$\{(?!file:)[A-Z_]*KEY/);
  const dir = tempDir(t, 'perch-deploy-');
  writeFileSync(join(dir, 'perch_alpha_key'), 'a'.repeat(48) + '\n');
  assert.equal(parseConfig(config.replaceAll('/run/secrets/', `${dir}/`), {}).auth.keys[0]?.id, 'alpha');
});
