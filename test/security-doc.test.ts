import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { test } from 'node:test';

// Tests run from dist/test; SECURITY.md and the test sources sit at the repository root.
const ROOT = new URL('../../', import.meta.url);
const SECURITY = readFileSync(new URL('SECURITY.md', ROOT), 'utf8');

test('every threat in SECURITY.md names tests, and every test it names exists', { timeout: 10_000 }, () => {
  const threats = SECURITY.split('\n### ').slice(1);
  assert.deepEqual(
    threats.map((section) => section.split('\n')[0]),
    ['Stolen client key', 'Upstream credential leak', 'Cache poisoning', 'Denial of service', 'Pass-through keys', 'Log leakage', 'Admin endpoint abuse'],
  );
  for (const section of threats) {
    const citations = [...section.matchAll(/`([\w-]+\.test\.ts)`(?: \(([^)]*)\))?/g)];
    assert.ok(citations.length > 0, `no test named for ${section.split('\n')[0]}`);
    for (const [, file, titles] of citations) {
      const path = new URL(`test/${file}`, ROOT);
      assert.ok(existsSync(path), `${file} does not exist`);
      const source = readFileSync(path, 'utf8');
      // A quoted title may leave out words with …; it names a test whose title starts the same.
      for (const [, title] of (titles ?? '').matchAll(/"([^"]+)"/g)) {
        const parts = title!.replace(/\s+/g, ' ').split(/ ?… ?/).map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
        const pattern = new RegExp(`test\\(['\`]${parts.join("[^'`]*")}`);
        assert.match(source, pattern, `${file} has no test "${title}"`);
      }
    }
  }
});
