import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { onCleanup } from './cleanup.js';

/** A new directory under the system temp dir, removed with its content when the test ends. */
export function tempDir(t: TestContext, prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  onCleanup(t, () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
