import { applyRules } from './rules.js';
import { CONFIG, type FileConfig } from './schema.js';
import { Problems, isMapping } from './schema-helpers.js';
import type { Config } from './types.js';
import { walk } from './walk.js';

/**
 * Applies defaults and checks every key of an already parsed and substituted configuration tree:
 * first each key against its definition (schema.ts), then the rules between keys (rules.ts).
 * All problems are collected rather than stopping at the first, so one edit can fix them all.
 * The returned config is not frozen; `parseConfig` does that.
 */
export function validateConfig(raw: unknown): { config: Config } | { problems: string[] } {
  const problems = new Problems();
  if (!isMapping(raw)) {
    problems.add('(top level)', raw == null ? 'the configuration is empty' : 'must be a mapping');
    return { problems: problems.list };
  }
  const file = walk(CONFIG, raw, '', problems) as FileConfig;
  const config = applyRules(problems, file, raw);
  return problems.list.length > 0 ? { problems: problems.list } : { config };
}
