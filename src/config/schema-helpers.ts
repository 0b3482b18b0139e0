/**
 * Building blocks shared by the configuration checks: key-path formatting, the problem
 * collector that lets one pass over the file report every problem at once, and the unknown-key
 * check with its "did you mean".
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
  foreign?: Readonly<Record<string, string>>,
): void {
  for (const key of Object.keys(obj)) {
    if (known.includes(key)) continue;
    const elsewhere = foreign?.[key];
    if (elsewhere !== undefined) {
      problems.add(childPath(path, key), elsewhere);
      continue;
    }
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
function editDistance(a: string, b: string): number {
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
