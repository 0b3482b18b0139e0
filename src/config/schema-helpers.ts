/**
 * Building blocks shared by the configuration checks: key-path formatting, the problem
 * collector, and readers that report a problem and return a fallback instead of throwing, so one
 * pass over the file can report every problem at once.
 */

/** Names of keys, plans and upstreams: safe in logs, metric labels and key paths. */
export const NAME_PATTERN = /^[A-Za-z0-9_.-]{1,64}$/;

/**
 * Upstream names start with a letter: JavaScript orders integer-like object keys first, which
 * would silently change which upstream is "first", the default route.
 */
export const UPSTREAM_NAME_PATTERN = /^[A-Za-z][A-Za-z0-9_.-]{0,63}$/;

export class Problems {
  readonly list: string[] = [];

  add(path: string, message: string): void {
    this.list.push(`${path}: ${message}`);
  }
}

/**
 * Appends a mapping key to a key path. Keys that would make the path ambiguous (dots, spaces,
 * brackets) are quoted, so `rate_limits["a.b"]` is not mistaken for a nested key.
 */
export function childPath(path: string, key: string): string {
  const part = /^[A-Za-z0-9_-]+$/.test(key) ? key : `[${JSON.stringify(key)}]`;
  if (path === '') return part;
  return part.startsWith('[') ? `${path}${part}` : `${path}.${part}`;
}

export function indexPath(path: string, index: number): string {
  return `${path}[${index}]`;
}

/**
 * A mapping as YAML produces it. Buffers (`!!binary`) and other class instances are excluded so
 * they are reported as wrong types rather than walked as mappings.
 */
export function isMapping(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** Reads an own property only, so keys like `constructor` or `__proto__` are never inherited. */
export function field(obj: Record<string, unknown>, key: string): unknown {
  return Object.hasOwn(obj, key) ? obj[key] : undefined;
}

/** Reports every key of `obj` not in `known`, with a did-you-mean hint or the given `listing`. */
export function checkKeys(
  problems: Problems,
  obj: Record<string, unknown>,
  path: string,
  known: readonly string[],
  listing?: string,
): void {
  for (const key of Object.keys(obj)) {
    if (known.includes(key)) continue;
    const hint = listing ?? didYouMean(key, known);
    problems.add(childPath(path, key), hint === undefined ? 'unknown key' : `unknown key (${hint})`);
  }
}

/**
 * Suggests the closest known key within edit distance 2, or one the key extends or abbreviates
 * (`hostname` -> `host`, `timeout` -> `timeout_ms`), the other common kind of slip.
 */
function didYouMean(key: string, known: readonly string[]): string | undefined {
  const typed = key.toLowerCase();
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const candidate of known) {
    const distance = editDistance(typed, candidate);
    const [shorter, longer] = typed.length < candidate.length ? [typed, candidate] : [candidate, typed];
    const close = distance <= 2 || (shorter.length >= 3 && longer.startsWith(shorter));
    if (close && distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best === undefined ? undefined : `did you mean "${best}"?`;
}

/** Levenshtein distance; keys are short, so the quadratic table is fine. */
export function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const substitution = (previous[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1);
      current[j] = Math.min((previous[j] ?? 0) + 1, (current[j - 1] ?? 0) + 1, substitution);
    }
    previous = current;
  }
  return previous[b.length] ?? 0;
}

/**
 * Environment substitution always yields strings, so `port: "${PORT:-8080}"` must be accepted:
 * a string holding a plain decimal number counts as that number.
 */
function asNumber(value: unknown): number | undefined {
  if (typeof value === 'number') return value;
  if (typeof value === 'string' && /^-?\d+(\.\d+)?$/.test(value)) return Number(value);
  return undefined;
}

export interface IntegerSpec {
  readonly min: number;
  readonly max?: number;
  /** Returned when the field is absent (the default) or invalid. */
  readonly fallback: number;
  readonly required?: boolean;
  /** What a valid value is, e.g. `an integer from 0 to 65535`; reported as `must be ...`. */
  readonly expected: string;
}

/** An integer field; unless `spec.required`, absent gives `spec.fallback`. */
export function readInteger(
  problems: Problems,
  obj: Record<string, unknown>,
  key: string,
  path: string,
  spec: IntegerSpec,
): number {
  const raw = field(obj, key);
  if (raw === undefined) {
    if (spec.required === true) problems.add(childPath(path, key), 'is required');
    return spec.fallback;
  }
  const value = asNumber(raw);
  const inRange =
    value !== undefined &&
    Number.isSafeInteger(value) &&
    value >= spec.min &&
    (spec.max === undefined || value <= spec.max);
  if (!inRange) {
    problems.add(childPath(path, key), `must be ${spec.expected}`);
    return spec.fallback;
  }
  return value;
}

/** A required positive number, fractions allowed. */
export function readPositiveNumber(
  problems: Problems,
  obj: Record<string, unknown>,
  key: string,
  path: string,
): number {
  const raw = field(obj, key);
  const at = childPath(path, key);
  if (raw === undefined) {
    problems.add(at, 'is required');
    return 1;
  }
  const value = asNumber(raw);
  if (value === undefined || !Number.isFinite(value) || value <= 0) {
    problems.add(at, 'must be a positive number');
    return 1;
  }
  return value;
}

/** A string field; `fallback` undefined makes it required. */
export function readString(
  problems: Problems,
  obj: Record<string, unknown>,
  key: string,
  path: string,
  fallback?: string,
): string | undefined {
  const raw = field(obj, key);
  const at = childPath(path, key);
  if (raw === undefined) {
    if (fallback === undefined) problems.add(at, 'is required');
    return fallback;
  }
  if (typeof raw !== 'string') {
    problems.add(at, 'must be a string');
    return undefined;
  }
  return raw;
}

/** A boolean, or `"true"`/`"false"`: environment substitution yields strings. Undefined after a problem. */
export function readBoolean(problems: Problems, raw: Record<string, unknown>, key: string, path: string): boolean | undefined {
  const value = field(raw, key);
  if (value === true || value === 'true') return true;
  if (value === false || value === 'false') return false;
  problems.add(childPath(path, key), 'must be true or false');
  return undefined;
}

/** A string field that must be one of `choices`; absent gives `fallback`. */
export function readChoice<T extends string>(
  problems: Problems,
  obj: Record<string, unknown>,
  key: string,
  path: string,
  choices: readonly T[],
  fallback: T,
): T {
  const raw = readString(problems, obj, key, path, fallback);
  if (raw === undefined) return fallback;
  const known = choices.find((choice) => choice === raw);
  if (known === undefined) problems.add(childPath(path, key), `must be one of ${choices.join(', ')}`);
  return known ?? fallback;
}

/**
 * An optional mapping section: absent reads as empty so its defaults apply; anything else that is
 * not a mapping is a problem and also reads as empty, letting the rest of the file be checked.
 */
export function readSection(
  problems: Problems,
  obj: Record<string, unknown>,
  key: string,
  path: string,
): Record<string, unknown> {
  const raw = field(obj, key);
  if (raw === undefined) return {};
  if (!isMapping(raw)) {
    problems.add(childPath(path, key), 'must be a mapping');
    return {};
  }
  return raw;
}
