import { createHash } from 'node:crypto';
import { keysUnder } from './config-keys.js';
import type { AdminConfig, AdminKeyConfig, ApiKeyConfig, RateLimitPlan } from './types.js';
import { NAME_PATTERN, Problems, checkKeys, childPath, field, indexPath, isMapping, readBoolean, readString } from './schema-helpers.js';

/** Which list's path holds each secret seen so far: one secret must not open two doors. */
export type SecretsSeen = Map<string, string>;

/**
 * Client keys (`auth.keys`). A literal `key` is replaced by its SHA-256 so the secret does not
 * stay in memory longer than start-up; messages about keys name paths only, never the secret.
 * `plans` undefined: the plans are unusable (already reported), so references go unchecked.
 */
export function validateKeys(
  problems: Problems,
  authRaw: unknown,
  plans: Record<string, RateLimitPlan> | undefined,
  seen: SecretsSeen,
): ApiKeyConfig[] {
  if (authRaw === undefined) {
    problems.add('auth', 'is required (auth.keys lists the client keys)');
    return [];
  }
  return readKeyList(problems, authRaw, 'auth', seen, ['plan'], { plan: '' }, (entry, path) => {
    const plan = readString(problems, entry, 'plan', path);
    if (plan !== undefined && plans !== undefined && !Object.hasOwn(plans, plan)) {
      problems.add(childPath(path, 'plan'), `names no entry of rate_limits (${JSON.stringify(plan)})`);
    }
    return { plan: plan ?? '' };
  });
}

/**
 * The `admin` section: its keys (the rules of client keys, without a plan) and the optional
 * status page. Undefined when absent.
 */
export function validateAdmin(problems: Problems, adminRaw: unknown, seen: SecretsSeen): AdminConfig | undefined {
  if (adminRaw === undefined) return undefined;
  const keys = readKeyList<AdminKeyConfig>(problems, adminRaw, 'admin', seen, [], {}, () => ({}));
  const statusPage = isMapping(adminRaw) && field(adminRaw, 'status_page') !== undefined ? readBoolean(problems, adminRaw, 'status_page', 'admin') : false;
  return { keys, status_page: statusPage ?? false };
}

/** `<section>.keys`: a non-empty list of `{ id, key | sha256, ...extra }` with unique ids and secrets. */
function readKeyList<K extends AdminKeyConfig>(
  problems: Problems,
  sectionRaw: unknown,
  section: 'auth' | 'admin',
  seen: SecretsSeen,
  extraFields: readonly string[],
  /** The extra fields of an entry that is not even a mapping. */
  noExtra: Omit<K, keyof AdminKeyConfig>,
  readExtra: (entry: Record<string, unknown>, path: string) => Omit<K, keyof AdminKeyConfig>,
): K[] {
  if (!isMapping(sectionRaw)) {
    problems.add(section, 'must be a mapping');
    return [];
  }
  checkKeys(problems, sectionRaw, section, keysUnder(section));
  const listPath = `${section}.keys`;
  const raw = field(sectionRaw, 'keys');
  if (!Array.isArray(raw) || raw.length === 0) {
    problems.add(listPath, raw === undefined ? 'is required (at least one key)' : 'must be a non-empty list');
    return [];
  }
  const fields = keysUnder(`${section}.keys[]`);
  const idsSeen = new Map<string, string>();
  return raw.map((entry: unknown, i): K => {
    const path = indexPath(listPath, i);
    if (!isMapping(entry)) {
      problems.add(path, `must be a mapping with ${['id', ...extraFields].join(', ')} and key or sha256`);
      return { id: '', sha256: '', ...noExtra } as K;
    }
    checkKeys(problems, entry, path, fields);

    const id = readString(problems, entry, 'id', path);
    if (id !== undefined) {
      if (!NAME_PATTERN.test(id)) problems.add(childPath(path, 'id'), 'must match [A-Za-z0-9_.-]{1,64}');
      const earlier = idsSeen.get(id);
      if (earlier !== undefined) problems.add(childPath(path, 'id'), `repeats the id of ${earlier} (${JSON.stringify(id)})`);
      else idsSeen.set(id, path);
    }
    const extra = readExtra(entry, path);

    const secret = readSecret(problems, entry, path);
    if (secret !== undefined) {
      const earlier = seen.get(secret.digest);
      if (earlier !== undefined) problems.add(secret.path, `has the same secret as ${earlier}`);
      else seen.set(secret.digest, path);
    }
    return { id: id ?? '', sha256: secret?.digest ?? '', ...extra } as K;
  });
}

function readSecret(problems: Problems, entry: Record<string, unknown>, path: string): { digest: string; path: string } | undefined {
  const hasKey = field(entry, 'key') !== undefined;
  const hasDigest = field(entry, 'sha256') !== undefined;
  if (hasKey === hasDigest) {
    problems.add(path, hasKey ? 'set either key or sha256, not both' : 'needs key or sha256');
    return undefined;
  }
  if (hasKey) {
    const at = childPath(path, 'key');
    const key = field(entry, 'key');
    if (typeof key !== 'string') {
      problems.add(at, 'must be a string');
      return undefined;
    }
    if (key.length < 16) {
      problems.add(at, 'must be at least 16 characters (a shorter secret is guessable)');
      return undefined;
    }
    return { digest: createHash('sha256').update(key).digest('hex'), path: at };
  }
  const at = childPath(path, 'sha256');
  const digest = field(entry, 'sha256');
  if (typeof digest !== 'string' || !/^[0-9a-fA-F]{64}$/.test(digest)) {
    problems.add(at, 'must be 64 hex digits (a SHA-256 digest)');
    return undefined;
  }
  return { digest: digest.toLowerCase(), path: at };
}
