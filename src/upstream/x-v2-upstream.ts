import type { XV2UpstreamConfig } from '../config/types.js';
import type { EndpointName } from '../endpoints.js';
import { checkResponseBody } from '../schemas/response-check.js';
import { createHttpProvider, failed, type Dialect, type HttpProviderOptions } from './http-provider.js';
import type { Provider, UpstreamResult } from './upstream.js';
import { mapFollowing } from './x-v2/map-following.js';
import { mapReplies } from './x-v2/map-replies.js';
import { mapTimeline } from './x-v2/map-timeline.js';
import { mapTweet } from './x-v2/map-tweet.js';
import { mapUser } from './x-v2/map-user.js';
import { batchOutcomes, type ItemOutcome } from './x-v2/batch-outcome.js';
import { outcomeOf, type Outcome } from './x-v2/outcome.js';
import { MappingError, MappingGap } from './x-v2/read.js';
import { v2BatchRequest, v2Request } from './x-v2/requests.js';

/** Each endpoint's mapping from X's v2 body to the interface's v1 body. */
const MAPPINGS: Readonly<Record<EndpointName, (body: unknown) => object>> = {
  user: mapUser,
  user_by_username: mapUser,
  tweet: mapTweet,
  tweets: mapTimeline,
  replies: mapReplies,
  following: mapFollowing,
};

const LISTINGS: ReadonlySet<EndpointName> = new Set(['tweets', 'replies', 'following']);

/**
 * X's own rules for ids (signed 64-bit: at most 2^63 - 1) and usernames (at most 15 characters). The
 * interface allows more; X answers those 400, which would read as X failing and count against
 * the breaker. No such user or tweet can exist, so they are not found, without a call.
 */
const X_ID = /^[0-9]{1,19}$/;
/** X's ids are signed 64-bit integers: 9223372036854775808 and above have 19 digits but no user. */
const X_ID_MAX = 2n ** 63n - 1n;
const X_USERNAME = /^[A-Za-z0-9_]{1,15}$/;

/**
 * X's dialect: each request becomes X's v2 request (requests.ts), and each 200 is read for
 * "not found" (a 200 with only `errors`, cached as any 404), then mapped to the v1 body and
 * checked against the same schema as a `v1` provider's body, so a mapping bug or a change at X
 * is a 502 and a warning, never a malformed answer in the cache. Statuses, 429s (with
 * `x-rate-limit-reset`) and the usage cap's problem type are the shared HTTP protocol's.
 *
 * Every way a 200 can fail to be served, and whether it counts against X's health (the breaker
 * and the throttle): a resource that is missing or not visible to the app (`resource-not-found`,
 * `not-authorized-for-resource`) is `not_found`, an answer; a reference to what `includes` left
 * out is `mapping_gap`, a 502 for that request that does not count; only errors of another type,
 * a body not of the v2 shape and a mapped body not of the schema are `invalid_body`, which does,
 * because they are what X answers when its format changed, on every request alike.
 */
const X_V2_DIALECT: Dialect = {
  path: v2Request,
  known({ params }) {
    const { user_id: userId, tweet_id: tweetId, username } = params;
    const fits = (value: string | undefined, rule: RegExp) => value === undefined || rule.test(value);
    const id = (value: string | undefined) => fits(value, X_ID) && (value === undefined || BigInt(value) <= X_ID_MAX);
    return id(userId) && id(tweetId) && fits(username, X_USERNAME) ? undefined : { kind: 'not_found', unasked: true };
  },
  // X's 403 is about the endpoint, not the token: an endpoint outside the app's plan (following,
  // on some plans) answers 403 while every other endpoint still serves that same token.
  rejectsCredential: [401],
  forbidsEndpoint: [403],
  // User context only: an app-only bearer token gets 403 unsupported-authentication.
  whoAmI: '/2/users/me',
  success(request, parsed, _raw, status) {
    let outcome: Outcome;
    try {
      outcome = outcomeOf(parsed, LISTINGS.has(request.endpoint));
    } catch (error) {
      return unmapped(request.endpoint, error, status);
    }
    return resultOf(request.endpoint, outcome, parsed, status);
  },
  batch: {
    path: v2BatchRequest,
    /**
     * Each item as its single lookup would have been answered. The call itself is `ok` (X
     * answered, whatever it said of single items) unless no item could be answered: then it
     * is the first item's failure, so that a change of X's format weighs on its health as it
     * does on the single lookups.
     */
    success(requests, parsed, status) {
      const endpoint = requests[0]!.endpoint;
      let outcomes: ItemOutcome[];
      try {
        outcomes = batchOutcomes(requests, parsed);
      } catch (error) {
        return unmapped(endpoint, error, status);
      }
      const items = outcomes.map((outcome) =>
        outcome.kind === 'missing'
          ? failed('mapping_gap', `status ${status} with an X v2 batch answer that has neither data nor an error for one ${endpoint} asked`, status)
          : resultOf(endpoint, outcome, outcome.kind === 'data' ? outcome.body : undefined, status),
      );
      const answered = items.some((item) => item.kind === 'ok' || item.kind === 'not_found');
      return answered ? { kind: 'ok', body: NO_BODY, items } : { ...items[0]!, items };
    },
  },
};

const NO_BODY = Buffer.alloc(0);

/** One lookup's outcome (single, or an item of a batch) to its result: the body mapped and checked. */
function resultOf(endpoint: EndpointName, outcome: Outcome | ItemOutcome, body: unknown, status: number): UpstreamResult {
  if (outcome.kind === 'not_found') return { kind: 'not_found' };
  if (outcome.kind === 'errors') return failed('invalid_body', `status ${status} with errors and no data (${outcome.type})`, status);
  let v1: object;
  try {
    v1 = MAPPINGS[endpoint](body);
  } catch (error) {
    return unmapped(endpoint, error, status);
  }
  const mismatch = checkResponseBody(endpoint, v1);
  if (mismatch !== undefined) return failed('invalid_body', `the ${endpoint} body mapped from X v2 is not of the schema: ${mismatch}`, status);
  return { kind: 'ok', body: Buffer.from(JSON.stringify(v1)) };
}

/** A mapping that failed: a gap in this one answer, or a body not of X's shape. */
function unmapped(endpoint: EndpointName, error: unknown, status: number): UpstreamResult {
  if (error instanceof MappingGap) return failed('mapping_gap', `status ${status} with an X v2 ${endpoint} body that refers to what it left out: ${error.message}`, status);
  if (!(error instanceof MappingError)) throw error;
  return failed('invalid_body', `status ${status} with a body not of the X v2 ${endpoint} shape: ${error.message}`, status);
}

/** The innermost layer of an `x_v2` upstream. */
export function createXV2Upstream(name: string, config: XV2UpstreamConfig, options: HttpProviderOptions): Provider {
  return createHttpProvider(name, config, X_V2_DIALECT, options);
}
