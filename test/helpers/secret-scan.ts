import { parse } from 'yaml';
import { substituteEnv } from '../../src/config/env-substitution.js';

/** The shortest fragment of a secret that must never appear in a log. */
const FRAGMENT = 6;

/** What a request id (a UUID) is written in. */
const UUID_ALPHABET = /^[0-9a-f-]+$/i;

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
 * Runs of hex digits and hyphens alone are left out: log lines carry request ids (UUIDs), digest
 * prefixes and epoch times, and a secret's run of them turns up there by chance (a CI run failed
 * on `a-0123` and `-01234` of `test-key-alpha-0123456789`, with no other fragment of it). A secret
 * with no other fragment could not be checked at all, so it is refused.
 */
export function leakedFragments(text: string, secrets: Iterable<string>): string[] {
  const leaks = new Set<string>();
  for (const secret of secrets) {
    let checked = 0;
    for (let i = 0; i + FRAGMENT <= secret.length; i++) {
      const fragment = secret.slice(i, i + FRAGMENT);
      if (UUID_ALPHABET.test(fragment)) continue;
      checked++;
      if (text.includes(fragment)) leaks.add(fragment);
    }
    if (checked === 0 && secret.length >= FRAGMENT) throw new Error(`a test secret needs letters beyond a-f to be looked for in logs: ${secret}`);
  }
  return [...leaks];
}
