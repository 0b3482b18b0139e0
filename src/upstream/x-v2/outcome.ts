import { MappingError, object } from './read.js';

/**
 * What a 200 from X says before any mapping: the resource, or that it does not exist, or another
 * problem. X reports a missing user or tweet as 200 with only `errors`, and an empty listing as
 * `{"meta":{"result_count":0}}` with neither `data` nor `errors`. A resource the app may not see
 * (a protected account's tweets, timeline or following, a protected author's tweet) is also a 200
 * with only `errors`, of type `not-authorized-for-resource`: to a client of the interface it does
 * not exist either, and it is the same answer on every ask, so it is `not_found` (cached as a 404,
 * never weighed against X's health).
 */
export type Outcome =
  | { readonly kind: 'data' }
  | { readonly kind: 'not_found' }
  /** Only errors, none of them "not found": `type` is X's problem type, or `unknown`. */
  | { readonly kind: 'errors'; readonly type: string };

/** X's problem types are URLs under /2/problems/; only those are safe to repeat in a log. */
const PROBLEM_TYPE = /^https:\/\/api\.(?:twitter|x)\.com\/2\/problems\/[a-z-]{1,64}$/;

/** The problem types that say "this resource is not there for this app". */
const NOT_VISIBLE = /\/problems\/(?:resource-not-found|not-authorized-for-resource)$/;

/**
 * `listing`: the endpoint pages through a list, where no `data` is an empty page; for a single
 * user or tweet it is a body that cannot be mapped.
 */
export function outcomeOf(body: unknown, listing: boolean): Outcome {
  const top = object(body, '');
  if (top.data !== undefined) return { kind: 'data' };
  const errors = Array.isArray(top.errors) ? top.errors.filter((e): e is Record<string, unknown> => typeof e === 'object' && e !== null) : [];
  if (errors.length === 0) {
    if (listing) return { kind: 'data' };
    throw new MappingError('/data is missing');
  }
  if (errors.some(notVisible)) return { kind: 'not_found' };
  return { kind: 'errors', type: problemType(errors[0]!) };
}

/**
 * Whether one of X's errors says the resource is not there for this app. A suspended account
 * answers title "Forbidden" with the resource-not-found type: to a client of the interface it
 * does not exist either.
 */
export function notVisible(error: Readonly<Record<string, unknown>>): boolean {
  return error.title === 'Not Found Error' || (typeof error.type === 'string' && NOT_VISIBLE.test(error.type));
}

/** An error's problem type, where it is one of X's (safe to log), else `unknown`. */
export function problemType(error: Readonly<Record<string, unknown>>): string {
  const type = error.type;
  return typeof type === 'string' && PROBLEM_TYPE.test(type) ? type : 'unknown';
}
