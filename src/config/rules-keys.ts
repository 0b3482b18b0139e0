import { createHash } from 'node:crypto';
import { NAME_PATTERN, childPath, indexPath, type Problems } from './schema-helpers.js';
import { isBroken } from './walk.js';

/** Which list's path holds each secret seen so far: one secret must not open two doors. */
export type SecretsSeen = Map<string, string>;

/** A key entry as the definition leaves it: `key` or `sha256`, both optional there. */
export interface KeyEntry {
  readonly id: string;
  readonly key?: string;
  readonly sha256?: string;
}

/**
 * `auth.keys` and `admin.keys`: ids unique and well formed, exactly one of `key` and `sha256`,
 * no secret in two entries. A literal `key` becomes its SHA-256, so the secret does not stay in
 * memory past start-up; messages name paths only, never a secret.
 */
export function resolveKeys<E extends KeyEntry>(problems: Problems, entries: readonly E[], listPath: string, seen: SecretsSeen): (Omit<E, 'key'> & { sha256: string })[] {
  const ids = new Map<string, string>();
  return entries.map((entry, i) => {
    const path = indexPath(listPath, i);
    if (isBroken(entry)) return { ...entry, sha256: '' };
    if (entry.id !== '') {
      if (!NAME_PATTERN.test(entry.id)) problems.add(childPath(path, 'id'), 'must match [A-Za-z0-9_.-]{1,64}');
      const earlier = ids.get(entry.id);
      if (earlier !== undefined) problems.add(childPath(path, 'id'), `repeats the id of ${earlier} (${JSON.stringify(entry.id)})`);
      else ids.set(entry.id, path);
    }
    const secret = digestOf(problems, entry, path);
    if (secret !== undefined) {
      const earlier = seen.get(secret.digest);
      if (earlier !== undefined) problems.add(secret.path, `has the same secret as ${earlier}`);
      else seen.set(secret.digest, path);
    }
    const { key: _key, ...rest } = entry;
    return { ...rest, sha256: secret?.digest ?? '' };
  });
}

function digestOf(problems: Problems, entry: KeyEntry, path: string): { digest: string; path: string } | undefined {
  if ((entry.key === undefined) === (entry.sha256 === undefined)) {
    problems.add(path, entry.key !== undefined ? 'set either key or sha256, not both' : 'needs key or sha256');
    return undefined;
  }
  if (entry.key !== undefined) {
    const at = childPath(path, 'key');
    if (entry.key.length < 16) {
      problems.add(at, 'must be at least 16 characters (a shorter secret is guessable)');
      return undefined;
    }
    if (looksLikePlaceholder(entry.key)) {
      problems.add(at, 'still looks like a "${...}" placeholder after substitution (a variable left unset, or a "$${" that was meant as one)');
      return undefined;
    }
    return { digest: createHash('sha256').update(entry.key).digest('hex'), path: at };
  }
  const at = childPath(path, 'sha256');
  if (!/^[0-9a-fA-F]{64}$/.test(entry.sha256!)) {
    problems.add(at, 'must be 64 hex digits (a SHA-256 digest)');
    return undefined;
  }
  return { digest: entry.sha256!.toLowerCase(), path: at };
}

/**
 * A secret that still holds a whole reference after substitution (`${NAME}`, `${NAME:-default}`,
 * `${file:/path}`) is one that did not resolve. A lone `${` is not: a generated password or a
 * secret file may hold it, and substituted values stay literal.
 */
export function looksLikePlaceholder(secret: string): boolean {
  return /\$\{(?:[A-Za-z_][A-Za-z0-9_]*(?::-[^}]*)?|file:[^}]*)\}/.test(secret);
}

export function sha256Hex(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}
