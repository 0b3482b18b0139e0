/**
 * The six endpoints of the interface, in one table. Everything that varies by endpoint
 * (route matching, TTL key, not-found message) is looked up here, and the response schemas in
 * schemas/resources.ts, so adding an endpoint is a row in each, not a hunt through the code base.
 */

export const ENDPOINT_NAMES = ['user', 'user_by_username', 'tweets', 'replies', 'following', 'tweet'] as const;

export type EndpointName = (typeof ENDPOINT_NAMES)[number];

/** Path parameters after validation. Exactly one of the three is set, by endpoint. */
export interface PathParams {
  readonly user_id?: string;
  readonly username?: string;
  readonly tweet_id?: string;
}

/**
 * A validated, normalized request for one endpoint. `path` is the canonical upstream path with
 * its query (username lowercased, count defaulted, unknown parameters dropped); it doubles as the
 * cache key, so two requests share an entry exactly when the upstream would see the same request.
 */
export interface EndpointRequest {
  readonly endpoint: EndpointName;
  readonly params: PathParams;
  readonly count?: number;
  readonly cursor?: string;
  readonly path: string;
}

/** The path parameter each endpoint takes (listings take the user's id). */
export const PATH_PARAMETER: Readonly<Record<EndpointName, keyof PathParams>> = {
  user: 'user_id',
  user_by_username: 'username',
  tweets: 'user_id',
  replies: 'user_id',
  following: 'user_id',
  tweet: 'tweet_id',
};

/**
 * The path parameters' rules, in one place: the router applies them to request paths, and purge
 * bodies and upstream bodies go through the same ones, because a value that would not pass as a
 * path parameter must not become part of a cache key.
 */
export const PARAMETER_PATTERNS: Readonly<Record<keyof PathParams, RegExp>> = {
  user_id: /^[0-9]{1,20}$/,
  tweet_id: /^[0-9]{1,20}$/,
  username: /^[A-Za-z0-9_]{1,50}$/,
};

/**
 * The one spelling of a valid path parameter, so that one resource is one cache key, one purge
 * target and one provider call: an id without leading zeros (`007` is `7`, `000` is `0`), since the
 * provider reads ids as numbers; a username in lowercase, since the provider ignores its case.
 */
export function canonicalParameter(name: keyof PathParams, value: string): string {
  if (name === 'username') return value.toLowerCase();
  return value.replace(LEADING_ZEROS, '');
}

/** Zeros before the last digit: what `canonicalParameter` drops from an id. */
const LEADING_ZEROS = /^0+(?=[0-9])/;

export const DEFAULT_COUNT = 20;
export const MAX_COUNT = 100;
export const MAX_CURSOR_BYTES = 1024;

/** The 400 message for each parameter rule: the router's, and the purge body's for the same values. */
export const INVALID = {
  user_id: 'Invalid parameter: user_id must be 1-20 decimal digits',
  tweet_id: 'Invalid parameter: tweet_id must be 1-20 decimal digits',
  username: 'Invalid parameter: username must be 1-50 letters, digits or underscores',
  count: `Invalid parameter: count must be an integer from 1 to ${MAX_COUNT}`,
  cursor: `Invalid parameter: cursor must be at most ${MAX_CURSOR_BYTES} bytes with no control characters`,
  repeated: (name: string) => `Invalid parameter: ${name} must be given at most once`,
} as const;

export function isEndpointName(value: string): value is EndpointName {
  return (ENDPOINT_NAMES as readonly string[]).includes(value);
}

/** Which resource a 404 from the upstream refers to, for the client-facing message. */
export function notFoundSubject(endpoint: EndpointName): 'user' | 'tweet' {
  return endpoint === 'tweet' ? 'tweet' : 'user';
}
