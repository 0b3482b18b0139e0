import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { ERROR_MESSAGES, ERROR_TABLE } from '../src/errors/error-table.js';

// Tests run from dist/test; the README sits at the repository root.
const README = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');

/** Rows of the README's error table: `| E401 | 401 | Invalid API key | ... |`. */
function readmeRows(): Map<string, { status: number; message: string }> {
  const rows = new Map<string, { status: number; message: string }>();
  for (const line of README.split('\n')) {
    const cells = line.split('|').map((c) => c.trim());
    const match = /^`?(E\d{3})`?$/.exec(cells[1] ?? '');
    if (match === null) continue;
    rows.set(match[1]!, { status: Number(cells[2]), message: (cells[3] ?? '').replace(/^`|`$/g, '') });
  }
  return rows;
}

test("the README's error table lists exactly the codes, statuses and messages of the code's table", () => {
  const rows = readmeRows();
  assert.deepEqual([...rows.keys()].sort(), Object.keys(ERROR_TABLE).sort());
  for (const [code, { status, message }] of Object.entries(ERROR_TABLE)) {
    assert.deepEqual(rows.get(code), { status, message }, code);
  }
});

test('the README names every per-case message', () => {
  for (const message of Object.values(ERROR_MESSAGES)) assert.ok(README.includes(message), message);
});

test('the two messages the interface fixes are exact', () => {
  assert.equal(ERROR_TABLE.E401.message, 'Invalid API key');
  assert.equal(ERROR_TABLE.E429.message, 'Rate limit exceeded. Please try again later.');
});
