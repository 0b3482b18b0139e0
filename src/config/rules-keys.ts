import { createHash } from 'node:crypto';
import type { KeySecretConfig } from './types.js';
import { NAME_PATTERN, childPath, indexPath, type Problems } from './schema-helpers.js';
import { isBroken } from './walk.js';

/** Which list's path holds each secret seen so far: one secret must not open two doors. */
export type SecretsSeen = Map<string, string>;

/** One secret as the definition leaves it: `key` or `sha256`, both optional there. */
interface SecretEntry {
  readonly key?: string;
  readonly sha256?: string;
}

/** A key entry as the definition leaves it: one secret inline, or a list of them. */
export interface KeyEntry extends SecretEntry {
  readonly id: string;
  readonly secrets?: readonly (SecretEntry & { readonly not_after?: string })[];
}

/** RFC 3339 with its offset: a time without one would be read in the host's zone. */
const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:[Zz]|([+-])(\d{2}):(\d{2}))$/;

/**
 * `auth.keys` and `admin.keys`: ids unique and well formed, exactly one of `key`, `sha256` and
 * `secrets`, exactly one of `key` and `sha256` in each secret, no secret in two places. A literal
 * `key` becomes its SHA-256, so the secret does not stay in memory past start-up; messages name
 * paths only, never a secret.
 */
export function resolveKeys<E extends KeyEntry>(
  problems: Problems,
  entries: readonly E[],
  listPath: string,
  seen: SecretsSeen,
): (Omit<E, 'key' | 'sha256' | 'secrets'> & { secrets: readonly KeySecretConfig[] })[] {
  const ids = new Map<string, string>();
  return entries.map((entry, i) => {
    const path = indexPath(listPath, i);
    const { key: _key, sha256: _sha256, secrets: listed, ...rest } = entry;
    if (isBroken(entry)) return { ...rest, secrets: [] };
    if (entry.id !== '') {
      if (!NAME_PATTERN.test(entry.id)) problems.add(childPath(path, 'id'), 'must match [A-Za-z0-9_.-]{1,64}');
      const earlier = ids.get(entry.id);
      if (earlier !== undefined) problems.add(childPath(path, 'id'), `repeats the id of ${earlier} (${JSON.stringify(entry.id)})`);
      else ids.set(entry.id, path);
    }
    if (listed === undefined) {
      const secret = digestOf(problems, entry, path, 'needs key, sha256 or secrets');
      return { ...rest, secrets: secret === undefined ? [] : [{ sha256: unique(problems, seen, secret, path) }] };
    }
    if (entry.key !== undefined || entry.sha256 !== undefined) problems.add(path, 'set either key or sha256 or secrets, not two of them');
    const secretsPath = childPath(path, 'secrets');
    const secrets = listed.flatMap((item, j): KeySecretConfig[] => {
      const itemPath = indexPath(secretsPath, j);
      if (isBroken(item)) return [];
      const secret = digestOf(problems, item, itemPath, 'needs key or sha256');
      const notAfterMs = item.not_after === undefined ? undefined : timeOf(problems, item.not_after, childPath(itemPath, 'not_after'));
      if (secret === undefined) return [];
      return [{ sha256: unique(problems, seen, secret, itemPath), ...(notAfterMs === undefined ? {} : { notAfterMs }) }];
    });
    return { ...rest, secrets };
  });
}

function unique(problems: Problems, seen: SecretsSeen, secret: { digest: string; path: string }, owner: string): string {
  const earlier = seen.get(secret.digest);
  if (earlier !== undefined) problems.add(secret.path, `has the same secret as ${earlier}`);
  else seen.set(secret.digest, owner);
  return secret.digest;
}

function timeOf(problems: Problems, text: string, path: string): number | undefined {
  const ms = rfc3339Ms(text);
  if (ms === undefined) problems.add(path, 'must be an RFC 3339 time with its offset, like 2026-12-31T00:00:00Z');
  return ms;
}

/**
 * ms since the epoch, or undefined unless every field is in its range: Date.parse rolls an
 * impossible date over (2026-02-31 is March 3rd, T24:00 the next day), which would move a
 * secret's end by days without a word.
 */
function rfc3339Ms(text: string): number | undefined {
  const m = RFC3339.exec(text);
  if (m === null) return undefined;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  const fraction = m[7] === undefined ? 0 : Math.floor(Number(m[7]) * 1000);
  const offsetMinutes = m[8] === undefined ? 0 : (m[8] === '-' ? -1 : 1) * (Number(m[9]) * 60 + Number(m[10]));
  // Day 0 of the next month is this month's last day (setUTCFullYear, unlike Date.UTC, takes years below 100 as they are).
  const lastDay = new Date(0);
  lastDay.setUTCFullYear(year, month, 0);
  if (month < 1 || month > 12 || day < 1 || day > lastDay.getUTCDate() || hour > 23 || minute > 59 || second > 59) return undefined;
  if (Number(m[9] ?? 0) > 23 || Number(m[10] ?? 0) > 59) return undefined;
  const utc = new Date(0);
  utc.setUTCFullYear(year, month - 1, day);
  utc.setUTCHours(hour, minute, second, fraction);
  return utc.getTime() - offsetMinutes * 60_000;
}

function digestOf(problems: Problems, entry: SecretEntry, path: string, needs: string): { digest: string; path: string } | undefined {
  if ((entry.key === undefined) === (entry.sha256 === undefined)) {
    problems.add(path, entry.key !== undefined ? 'set either key or sha256, not both' : needs);
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
 * Each secret of `auth.keys` and `admin.keys` already past its `not_after` at `nowMs`, as a line
 * for `--check-config`: the file is valid, but that secret opens nothing (and a key with no
 * other secret, nothing at all).
 */
export function secretsPastEnd(lists: Readonly<Record<string, readonly { readonly id: string; readonly secrets: readonly KeySecretConfig[] }[]>>, nowMs: number): string[] {
  return Object.entries(lists).flatMap(([listPath, keys]) =>
    keys.flatMap((key, i) => {
      const past = (secret: KeySecretConfig) => secret.notAfterMs !== undefined && nowMs > secret.notAfterMs;
      const dead = key.secrets.every(past);
      return key.secrets.flatMap((secret, j) =>
        past(secret)
          ? [`${listPath}[${i}].secrets[${j}]: not_after ${new Date(secret.notAfterMs!).toISOString()} is past: this secret is refused${dead ? `, and key ${JSON.stringify(key.id)} has no other` : ''}`]
          : [],
      );
    }),
  );
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
