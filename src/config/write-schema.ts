import { readFileSync, writeFileSync } from 'node:fs';
import { configSchema } from './json-schema.js';
import { withTable } from './readme-table.js';

/**
 * `npm run schema`: writes config/perch.schema.json and the configuration table of
 * docs/configuration.md from
 * the definition (schema.ts). Both are committed so editors and readers need no build; a test
 * fails while either differs from what this writes.
 */
const root = new URL('../../../', import.meta.url);
writeFileSync(new URL('config/perch.schema.json', root), `${JSON.stringify(configSchema(), null, 2)}\n`);
const page = new URL('docs/configuration.md', root);
writeFileSync(page, withTable(readFileSync(page, 'utf8')));
