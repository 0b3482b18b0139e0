/**
 * Readers for X API v2 bodies. A mapping needs certain fields with certain types; when one is
 * missing or of another type the reader throws a `MappingError` naming where, as a JSON pointer,
 * never with a value from the body, so the reason is safe to log like a schema mismatch.
 */

/** A v2 body that lacks what the v1 shape needs. */
export class MappingError extends Error {
  override readonly name: string = 'MappingError';
}

/**
 * A body of the right shape that refers to an object X left out of `includes` (a tweet whose
 * author it did not expand, e.g. one withheld or protected since): a gap in this one answer,
 * not X failing or changing its format, so it must not count against X's health.
 */
export class MappingGap extends MappingError {
  override readonly name = 'MappingGap';
}

export type Json = Readonly<Record<string, unknown>>;

export function object(value: unknown, path: string): Json {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new MappingError(`${where(path)} must be object`);
  return value as Json;
}

export function string(value: unknown, path: string): string {
  if (typeof value !== 'string') throw new MappingError(`${where(path)} must be string`);
  return value;
}

/** X omits a profile field the user left empty; the interface wants a string, so "". */
export function optionalString(value: unknown, path: string): string {
  return value === undefined ? '' : string(value, path);
}

export function count(value: unknown, path: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) throw new MappingError(`${where(path)} must be number`);
  return value;
}

/** A metric X leaves out (e.g. `quote_count` on older payloads) counts 0. */
export function optionalCount(value: unknown, path: string): number {
  return value === undefined ? 0 : count(value, path);
}

export function optionalBoolean(value: unknown, path: string): boolean {
  if (value === undefined) return false;
  if (typeof value !== 'boolean') throw new MappingError(`${where(path)} must be boolean`);
  return value;
}

/** An array X omits when it would be empty (`data` of an empty page, an absent entity kind). */
export function optionalList(value: unknown, path: string): readonly unknown[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new MappingError(`${where(path)} must be array`);
  return value;
}

function where(path: string): string {
  return path === '' ? 'the body' : path;
}
