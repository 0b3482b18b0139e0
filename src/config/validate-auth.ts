import type { AuthConfig, RateLimitPlan } from './types.js';
import { Problems, checkKeys, childPath, field, isMapping, readChoice, readInteger, readString } from './schema-helpers.js';
import { keysUnder } from './config-keys.js';
import { validateKeys, type SecretsSeen } from './validate-keys.js';

/** Keys of `auth` that only mode `upstream` reads. */
const UPSTREAM_FIELDS = ['default_plan', 'verify_ttl_seconds', 'reject_ttl_seconds', 'remembered_keys'];

const TTL = { min: 1, max: 86_400, expected: 'an integer from 1 to 86400' };

/**
 * `auth`: mode `keys` (perch checks `auth.keys`) or `upstream` (the provider checks each key,
 * see src/auth/upstream-verifier.ts). An option of the other mode is a problem rather than
 * ignored, so a file never reads as if it did something it does not.
 * `plans` undefined: the plans are unusable (already reported), so references go unchecked.
 */
export function validateAuth(
  problems: Problems,
  raw: unknown,
  plans: Record<string, RateLimitPlan> | undefined,
  seen: SecretsSeen,
): AuthConfig {
  const section = isMapping(raw) ? raw : {};
  const mode = readChoice(problems, section, 'mode', 'auth', ['keys', 'upstream'] as const, 'keys');
  const upstream = {
    verify_ttl_seconds: readInteger(problems, section, 'verify_ttl_seconds', 'auth', { ...TTL, fallback: 300 }),
    reject_ttl_seconds: readInteger(problems, section, 'reject_ttl_seconds', 'auth', { ...TTL, fallback: 60 }),
    remembered_keys: readInteger(problems, section, 'remembered_keys', 'auth', {
      min: 1,
      max: 10_000_000,
      fallback: 100_000,
      expected: 'an integer from 1 to 10000000',
    }),
  };
  if (mode === 'keys') {
    for (const name of UPSTREAM_FIELDS) {
      if (field(section, name) !== undefined) problems.add(childPath('auth', name), 'applies only with mode: upstream');
    }
    return { mode, keys: validateKeys(problems, raw, plans, seen), ...upstream };
  }
  checkKeys(problems, section, 'auth', keysUnder('auth'));
  if (field(section, 'keys') !== undefined) {
    problems.add('auth.keys', 'must be absent with mode: upstream (the provider checks every key)');
  }
  const plan = readString(problems, section, 'default_plan', 'auth');
  if (plan !== undefined && plans !== undefined && !Object.hasOwn(plans, plan)) {
    problems.add('auth.default_plan', `names no entry of rate_limits (${JSON.stringify(plan)})`);
  }
  return { mode, keys: [], ...(plan === undefined ? {} : { default_plan: plan }), ...upstream };
}
