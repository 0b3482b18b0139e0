import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

// Tests run from dist/test; the repository root is two levels up.
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const read = (path: string) => readFileSync(join(ROOT, path), 'utf8');
const T = { timeout: 10_000 };

/** The files git tracks (and those added but not committed yet), matching `patterns`. */
function tracked(...patterns: string[]): string[] {
  const out = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard', '--', ...patterns], { cwd: ROOT, encoding: 'utf8' });
  return out.split('\n').filter((path) => path !== '' && !path.startsWith('node_modules/') && existsSync(join(ROOT, path)));
}

/**
 * The line of each fence left open (CommonMark: a fence of ``` or ~~~, closed by one of the same
 * character at least as long with nothing after it). An unclosed fence turns the rest of the page
 * into code.
 */
function unclosedFences(markdown: string): number[] {
  let open: { char: string; length: number; line: number } | undefined;
  markdown.split('\n').forEach((text, i) => {
    const fence = /^\s*(`{3,}|~{3,})(.*)$/.exec(text);
    if (fence === null) return;
    const [, marks, rest] = fence as unknown as [string, string, string];
    if (open === undefined) {
      // A backtick in a backtick fence's info string makes the line inline code, not a fence.
      if (marks[0] === '`' && rest.includes('`')) return;
      open = { char: marks[0]!, length: marks.length, line: i + 1 };
    }
    else if (marks[0] === open.char && marks.length >= open.length && rest.trim() === '') open = undefined;
  });
  return open === undefined ? [] : [open.line];
}

/**
 * Words an example digest must not be the SHA-256 of: a copied config with one accepts that word
 * as a key. Each as typed, with `echo`'s newline, and capitalized.
 */
const WORDS = [
  'test', 'password', 'secret', 'admin', 'changeme', 'hello', 'example', 'perch', 'key', 'demo', 'apikey', 'api-key', 'token',
  'foo', 'bar', 'foobar', 'qwerty', 'letmein', '123456', '12345678', 'abc123', 'alpha', 'beta', 'bravo', 'ops', 'client',
  'user', 'root', 'default', 'guest', 'xxx', 'x', 'a', 'batch', 'hello world', 'mykey', 'my-key', 'secretkey', 'test-key',
];
const WEAK = new Map(
  WORDS.flatMap((word) => [word, `${word}\n`, word[0]!.toUpperCase() + word.slice(1), word.toUpperCase()]).map((word) => [createHash('sha256').update(word).digest('hex'), word]),
);

/** Each 64-hex-digit run of `text` that is the SHA-256 of a dictionary word, with the word. */
function weakDigests(text: string): string[] {
  return [...text.matchAll(/(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])/g)].flatMap((m) => {
    const word = WEAK.get(m[0].toLowerCase());
    return word === undefined ? [] : [`${m[0].slice(0, 12)}... = sha256(${JSON.stringify(word)})`];
  });
}

test('the checks themselves: an unclosed fence and a digest of a word are found, a closed one and a random digest are not', T, () => {
  assert.deepEqual(unclosedFences('a\n```yaml\nx: 1\n```\nb\n'), []);
  assert.deepEqual(unclosedFences('a\n```yaml\nx: 1\n\nb\n'), [2]);
  assert.deepEqual(unclosedFences('````md\n```\n````\n'), [], 'a longer fence holds a shorter one');
  assert.deepEqual(unclosedFences('  ```sh\n  ls\n  ```\n~~~\n'), [4], 'indented fences in lists count, and ~~~ too');
  assert.deepEqual(unclosedFences('```\n``` not a close\n'), [1]);
  assert.deepEqual(unclosedFences('```` ``` ```` is how a fence is typed\n'), [], 'inline code at the start of a line is no fence');
  assert.deepEqual(unclosedFences('~~~ `x`\n'), [1], 'a tilde fence may have backticks in its info string');
  const testDigest = createHash('sha256').update('test').digest('hex');
  assert.deepEqual(weakDigests(`sha256: "${testDigest}"`), [`${testDigest.slice(0, 12)}... = sha256("test")`]);
  assert.deepEqual(weakDigests(`sha256: ${createHash('sha256').update('changeme\n').digest('hex').toUpperCase()}`).length, 1);
  assert.deepEqual(weakDigests(`sha256: ${createHash('sha256').update('x7Gq2pVn9LrT4wZk').digest('hex')}`), []);
});

test('every tracked Markdown file closes every code fence', T, () => {
  const files = tracked('*.md');
  assert.ok(files.length >= 15, `found ${files.length} Markdown files`);
  const open = files.flatMap((path) => unclosedFences(read(path)).map((line) => `${path}:${line}`));
  assert.deepEqual(open, [], 'a fence opened here is never closed');
});

test('no example digest in the docs or the config examples is the SHA-256 of a dictionary word', T, () => {
  const files = [...tracked('*.md'), ...tracked('config/*', 'deploy/*')];
  assert.ok(files.includes('docs/configuration.md') && files.includes('config/perch.yaml'));
  const weak = files.flatMap((path) => weakDigests(read(path)).map((found) => `${path}: ${found}`));
  assert.deepEqual(weak, []);
});

test('every deploy/ file the docs name exists', T, () => {
  const missing = tracked('*.md').flatMap((path) =>
    [...read(path).matchAll(/\bdeploy\/[A-Za-z0-9_.-]+\.(?:ya?ml|json)\b/g)].map((m) => m[0]).filter((file) => !existsSync(join(ROOT, file))).map((file) => `${path}: ${file}`),
  );
  assert.deepEqual(missing, []);
});

test("CHANGELOG.md has a section for package.json's version, newest first, with upgrade notes, and package-lock.json agrees", T, () => {
  const { version } = JSON.parse(read('package.json')) as { version: string };
  const lock = JSON.parse(read('package-lock.json')) as { version: string; packages: Record<string, { version?: string }> };
  assert.deepEqual([lock.version, lock.packages['']?.version], [version, version]);
  const changelog = read('CHANGELOG.md');
  const released = [...changelog.matchAll(/^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2}|unreleased)$/gm)].map((m) => m[1]);
  assert.equal(released[0], version, 'the newest section is the current version');
  assert.match(changelog, /^## \[Unreleased\]$/m);
  assert.match(changelog, new RegExp(`^### Upgrading from ${released[1]?.replaceAll('.', '\\.') ?? ''}$`, 'm'), 'upgrade notes from the version before');
});
