import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { ERROR_MESSAGES, ERROR_TABLE } from '../src/errors/error-table.js';

// Tests run from dist/test; docs/ sits at the repository root.
const ERRORS_PAGE = readFileSync(new URL('../../docs/errors.md', import.meta.url), 'utf8');

/** Rows of the error table of docs/errors.md: `| E401 | 401 | Invalid API key | ... |`. */
function pageRows(): Map<string, { status: number; message: string }> {
  const rows = new Map<string, { status: number; message: string }>();
  for (const line of ERRORS_PAGE.split('\n')) {
    const cells = line.split('|').map((c) => c.trim());
    const match = /^`?(E\d{3})`?$/.exec(cells[1] ?? '');
    if (match === null) continue;
    rows.set(match[1]!, { status: Number(cells[2]), message: (cells[3] ?? '').replace(/^`|`$/g, '') });
  }
  return rows;
}

test("the error table of docs/errors.md lists exactly the codes, statuses and messages of the code's table", () => {
  const rows = pageRows();
  assert.deepEqual([...rows.keys()].sort(), Object.keys(ERROR_TABLE).sort());
  for (const [code, { status, message }] of Object.entries(ERROR_TABLE)) {
    assert.deepEqual(rows.get(code), { status, message }, code);
  }
});

test('docs/errors.md names every per-case message', () => {
  for (const message of Object.values(ERROR_MESSAGES)) assert.ok(ERRORS_PAGE.includes(message), message);
});

test('the two messages the interface fixes are exact', () => {
  assert.equal(ERROR_TABLE.E401.message, 'Invalid API key');
  assert.equal(ERROR_TABLE.E429.message, 'Rate limit exceeded. Please try again later.');
});
