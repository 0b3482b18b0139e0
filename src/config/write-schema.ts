import { readFileSync, writeFileSync } from 'node:fs';
import { configSchema } from './json-schema.js';
import { describeFrom, readmeRows } from './readme-table.js';

/**
 * `npm run schema`: writes config/perch.schema.json from the key table, with the README's
 * meanings as descriptions. The file is committed so editors can reference it without a build;
 * a test fails while it differs from what this would write.
 */
const root = new URL('../../../', import.meta.url);
const describe = describeFrom(readmeRows(readFileSync(new URL('README.md', root), 'utf8')));
writeFileSync(new URL('config/perch.schema.json', root), `${JSON.stringify(configSchema(describe), null, 2)}\n`);
