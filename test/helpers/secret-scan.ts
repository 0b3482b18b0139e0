import { parse } from 'yaml';
import { substituteEnv } from '../../src/config/env-substitution.js';

/** The shortest fragment of a secret that must never appear in a log. */
const FRAGMENT = 6;

/** Keys whose values are secrets wherever they stand in a configuration file. */
const SECRET_KEYS = new Set(['key', 'bearer_token', 'password', 'sentinel_password']);

/**
 * Every secret a configuration file holds: client and admin keys, upstream header values and
 * bearer tokens, Redis passwords (also inside URLs). Read from the YAML as written, after
 * `${ENV}` substitution, because the validated config keeps only digests.
 */
export function secretsOf(yaml: string, env: NodeJS.ProcessEnv): string[] {
  const substituted = substituteEnv(parse(yaml) as unknown, env);
  const found: string[] = [];
  const visit = (node: unknown, key: string, inHeaders: boolean): void => {
    if (typeof node === 'string') {
      if (SECRET_KEYS.has(key) || inHeaders) found.push(node);
      const password = /^rediss?:\/\/[^:@/]*:([^@/]+)@/.exec(node)?.[1];
      if (password !== undefined) found.push(decodeURIComponent(password));
      return;
    }
    if (Array.isArray(node)) node.forEach((item) => visit(item, key, inHeaders));
    else if (typeof node === 'object' && node !== null) for (const [k, v] of Object.entries(node)) visit(v, k, inHeaders || k === 'headers');
  };
  visit(substituted.value, '', false);
  return found;
}

/**
 * The fragments of `secrets` that appear in `text`: every run of FRAGMENT characters of each.
 * Runs of hex digits alone are left out: log lines carry request ids, digest prefixes and
 * epoch times, and a secret's digit run would turn up in them by chance.
 */
export function leakedFragments(text: string, secrets: Iterable<string>): string[] {
  const leaks = new Set<string>();
  for (const secret of secrets) {
    for (let i = 0; i + FRAGMENT <= secret.length; i++) {
      const fragment = secret.slice(i, i + FRAGMENT);
      if (/^[0-9a-f]+$/i.test(fragment)) continue;
      if (text.includes(fragment)) leaks.add(fragment);
    }
  }
  return [...leaks];
}
