import { readFileSync, writeFileSync } from 'node:fs';
import { configSchema } from './json-schema.js';
import { withTable } from './readme-table.js';

/**
 * `npm run schema`: writes config/perch.schema.json and the README's configuration table from
 * the definition (schema.ts). Both are committed so editors and readers need no build; a test
 * fails while either differs from what this writes.
 */
const root = new URL('../../../', import.meta.url);
writeFileSync(new URL('config/perch.schema.json', root), `${JSON.stringify(configSchema(), null, 2)}\n`);
const readme = new URL('README.md', root);
writeFileSync(readme, withTable(readFileSync(readme, 'utf8')));
