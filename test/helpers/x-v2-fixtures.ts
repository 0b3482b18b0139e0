import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const DIR = fileURLToPath(new URL('../../../test/fixtures/x_v2/', import.meta.url));

/** A recorded-shape X API v2 payload from test/fixtures/x_v2, parsed afresh on each call. */
export function xFixture(name: string): any {
  return JSON.parse(readFileSync(`${DIR}${name}.json`, 'utf8'));
}

/** The same payload as the bytes a stand-in serves. */
export function xFixtureText(name: string): string {
  return readFileSync(`${DIR}${name}.json`, 'utf8');
}
