import { RESPONSE_SCHEMA, SCHEMAS } from '../schemas/resources.js';
import { PERCH_VERSION } from '../version.js';

/**
 * The OpenAPI 3.1 description of perch's API, served at `/openapi.json`. Kept as code so it ships
 * in the build with nothing to copy. Its component schemas are the very objects perch checks
 * upstream bodies with (src/schemas/response-check.ts), and test/openapi.test.ts validates live
 * responses against it, so it cannot drift from what perch answers.
 */

const header = (name: string) => ({ $ref: `#/components/headers/${name}` });

/** Every answer after the rate limiter carries these (all but 401 and unknown routes). */
const RATE_LIMIT_HEADERS = {
  RateLimit: header('RateLimit'),
  'RateLimit-Policy': header('RateLimit-Policy'),
  'x-rate-limit-limit': header('x-rate-limit-limit'),
  'x-rate-limit-remaining': header('x-rate-limit-remaining'),
  'x-rate-limit-reset': header('x-rate-limit-reset'),
};

const error = (description: string, extraHeaders: Record<string, unknown> = {}) => ({
  description,
  headers: { 'X-Request-Id': header('X-Request-Id'), ...extraHeaders },
  content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } },
});

/** An error perch sends after the limiter, possibly from the cache or upstream path. */
const limitedError = (description: string, extraHeaders: Record<string, unknown> = {}) =>
  error(description, { ...RATE_LIMIT_HEADERS, 'Cache-Status': header('Cache-Status'), ...extraHeaders });

const COMMON_ERRORS = {
  '401': error('E401 Invalid API key: X-API-Key missing, empty or unknown'),
  '405': limitedError('E405 Method not allowed: a method other than GET or HEAD', {
    Allow: { description: 'The methods the route answers', schema: { type: 'string', const: 'GET, HEAD' } },
  }),
  '408': error('E408 Request timeout: the request head did not arrive within the server bound'),
  '417': error('E417 Expectation failed: an Expect other than 100-continue'),
  '429': limitedError("E429 Rate limit exceeded. Please try again later. (the key's plan, or the upstream's)", {
    'Retry-After': header('Retry-After'),
  }),
  '431': error('E431 Request header fields too large'),
  '500': limitedError('E500 Internal server error'),
  '502': limitedError('E502 Upstream error'),
  '504': limitedError('E504 Upstream timeout'),
};

/** What a 200 and its 304 both carry: everything but the headers that describe a body. */
const CACHED_HEADERS = {
  'X-Request-Id': header('X-Request-Id'),
  'Cache-Status': header('Cache-Status'),
  Age: { description: 'Seconds since the upstream answered; on cache hits and stale answers only', schema: { type: 'integer', minimum: 0 } },
  'Cache-Control': { description: 'private, max-age=N: how much longer perch itself would keep the answer', schema: { type: 'string' } },
  Vary: {
    description: 'X-API-Key: answers are per client; with cache.compression on (the default), also Accept-Encoding',
    schema: { type: 'string', enum: ['X-API-Key', 'X-API-Key, Accept-Encoding'] },
  },
  ETag: header('ETag'),
  'Last-Modified': header('Last-Modified'),
  ...RATE_LIMIT_HEADERS,
};

const ok = (schema: string, description: string) => ({
  description,
  headers: {
    ...CACHED_HEADERS,
    'Content-Encoding': {
      description: 'br or gzip when the client accepts it (Accept-Encoding) and the cached body has that variant; absent for the identity body',
      schema: { type: 'string', enum: ['br', 'gzip'] },
    },
  },
  content: { 'application/json': { schema: { $ref: `#/components/schemas/${schema}` } } },
});

const NOT_MODIFIED = {
  description:
    "Not Modified: the client's If-None-Match names this representation's ETag (or is *), or, without If-None-Match, If-Modified-Since is no earlier than Last-Modified. No body; counted as a cache hit",
  headers: CACHED_HEADERS,
};

const param = (name: string) => ({ $ref: `#/components/parameters/${name}` });

function operation(operationId: string, summary: string, parameters: object[], schema: string, notFound: string) {
  return {
    get: {
      operationId,
      summary,
      parameters,
      responses: {
        '200': ok(schema, summary),
        '304': NOT_MODIFIED,
        '400': limitedError('E400 Invalid request: a malformed parameter, named in the message, or a cursor the upstream rejects'),
        '404': limitedError(`E404 ${notFound}`),
        ...COMMON_ERRORS,
      },
    },
  };
}

export const OPENAPI_DOCUMENT = {
  openapi: '3.1.0',
  jsonSchemaDialect: 'https://json-schema.org/draft/2020-12/schema',
  info: {
    title: 'perch',
    version: PERCH_VERSION,
    description:
      'Read-only social account data, served through perch (caching, rate limiting). Every endpoint also answers HEAD, and other methods with 405 E405.',
    license: { name: 'MIT', identifier: 'MIT' },
  },
  // Relative: the document is served by the instance it describes, whatever its address.
  servers: [{ url: '/', description: 'The perch instance serving this document' }],
  security: [{ apiKey: [] }],
  paths: {
    '/v1/users/{user_id}': operation('getUser', 'Fetch one user', [param('user_id')], RESPONSE_SCHEMA.user, 'User not found'),
    '/v1/users/by/username/{username}': operation('getUserByUsername', 'Fetch one user by username', [param('username')], RESPONSE_SCHEMA.user_by_username, 'User not found'),
    '/v1/users/{user_id}/tweets': operation('listTweets', "Page through a user's tweets", [param('user_id'), param('cursor')], RESPONSE_SCHEMA.tweets, 'User not found'),
    '/v1/users/{user_id}/replies': operation('listReplies', "Page through a user's replies", [param('user_id'), param('cursor')], RESPONSE_SCHEMA.replies, 'User not found'),
    '/v1/users/{user_id}/following': operation(
      'listFollowing',
      'Page through the accounts a user follows',
      [param('user_id'), param('count'), param('cursor')],
      RESPONSE_SCHEMA.following,
      'User not found',
    ),
    '/v1/tweets/{tweet_id}': operation('getTweet', 'Fetch one tweet', [param('tweet_id')], RESPONSE_SCHEMA.tweet, 'Tweet not found'),
  },
  components: {
    securitySchemes: { apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key' } },
    headers: {
      'X-Request-Id': {
        description: "The client's X-Request-Id when it matches [A-Za-z0-9._:-]{1,128}, else a new UUID",
        schema: { type: 'string' },
      },
      'Cache-Status': {
        description:
          'RFC 9211: perch; hit; ttl=N[; detail=redis], perch; fwd=miss[; collapsed][; stored][; detail=redis], or perch; fwd=stale; ttl=-N',
        schema: { type: 'string' },
      },
      RateLimit: {
        description: 'IETF httpapi-ratelimit-headers draft: "<plan>";r=<whole tokens left>;t=<seconds until the bucket is full>',
        schema: { type: 'string' },
      },
      'RateLimit-Policy': {
        description: 'IETF httpapi-ratelimit-headers draft: "<plan>";q=<bucket size>;w=<seconds an empty bucket takes to fill>',
        schema: { type: 'string' },
      },
      'Retry-After': { description: 'Whole seconds to wait, at least 1', schema: { type: 'integer', minimum: 1 } },
      ETag: {
        description:
          'Strong validator of the cached body: "<22 base64url characters of its SHA-256>", the same on every instance; a compressed variant\'s tag ends in -br or -gzip inside the quotes. On 200s from the cache and answers stored by a miss',
        schema: { type: 'string', pattern: '^"[A-Za-z0-9_-]{22}(-br|-gzip)?"$' },
      },
      'Last-Modified': { description: 'When these bytes first became the answer (HTTP-date); absent where no exact date is known (ETag remains)', schema: { type: 'string' } },
      'x-rate-limit-limit': {
        description: "With server.rate_limit_headers x_rate_limit (Twitter's dialect): the plan's bucket size",
        schema: { type: 'integer', minimum: 1 },
      },
      'x-rate-limit-remaining': {
        description: 'With server.rate_limit_headers x_rate_limit: whole tokens left',
        schema: { type: 'integer', minimum: 0 },
      },
      'x-rate-limit-reset': {
        description: 'With server.rate_limit_headers x_rate_limit: when the bucket is full again, in epoch seconds',
        schema: { type: 'integer', minimum: 0 },
      },
    },
    parameters: {
      user_id: { name: 'user_id', in: 'path', required: true, schema: { type: 'string', pattern: '^[0-9]{1,20}$' } },
      tweet_id: { name: 'tweet_id', in: 'path', required: true, schema: { type: 'string', pattern: '^[0-9]{1,20}$' } },
      username: {
        name: 'username',
        in: 'path',
        required: true,
        description: 'Without @; matched case-insensitively',
        schema: { type: 'string', pattern: '^[A-Za-z0-9_]{1,50}$' },
      },
      count: { name: 'count', in: 'query', required: false, schema: { type: 'integer', minimum: 1, maximum: 100, default: 20 } },
      cursor: {
        name: 'cursor',
        in: 'query',
        required: false,
        description: 'Opaque cursor from an earlier page (cursor_bottom, or meta.next_token for replies); at most 1024 bytes',
        schema: { type: 'string', minLength: 1 },
      },
    },
    schemas: SCHEMAS,
  },
} as const;
