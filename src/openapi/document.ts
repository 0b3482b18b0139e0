import { SCHEMAS } from './schemas.js';

/**
 * The OpenAPI 3.1 description of perch's API, served at `/openapi.json`. Kept as code next to
 * the schemas so it ships in the build with nothing to copy; test/openapi.test.ts validates live
 * responses against it, so it cannot drift from what perch answers.
 */

const error = (description: string, extraHeaders: Record<string, unknown> = {}) => ({
  description,
  headers: { 'X-Request-Id': { $ref: '#/components/headers/X-Request-Id' }, ...extraHeaders },
  content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } },
});

const COMMON_ERRORS = {
  '401': error('E401 Invalid API key: X-API-Key missing, empty or unknown'),
  '429': error('E429 Rate limit exceeded. Please try again later.', {
    'Retry-After': { description: 'Whole seconds to wait, at least 1', schema: { type: 'integer', minimum: 1 } },
  }),
  '431': error('E431 Request header fields too large'),
  '500': error('E500 Internal server error'),
  '502': error('E502 Upstream error'),
  '504': error('E504 Upstream timeout'),
};

const ok = (schema: string, description: string) => ({
  description,
  headers: {
    'X-Request-Id': { $ref: '#/components/headers/X-Request-Id' },
    'Cache-Status': { description: 'RFC 9211: perch; hit; ttl=N, or perch; fwd=miss[; collapsed][; stored]', schema: { type: 'string' } },
    Age: { description: 'Seconds since the upstream answered; on cache hits only', schema: { type: 'integer', minimum: 0 } },
  },
  content: { 'application/json': { schema: { $ref: `#/components/schemas/${schema}` } } },
});

const param = (name: string) => ({ $ref: `#/components/parameters/${name}` });

function operation(operationId: string, summary: string, parameters: object[], schema: string, notFound: string) {
  return {
    get: {
      operationId,
      summary,
      parameters,
      responses: {
        '200': ok(schema, summary),
        '400': error('E400 Invalid request: a malformed parameter, named in the message, or a cursor the upstream rejects'),
        '404': error(`E404 ${notFound}`),
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
    version: '1',
    description:
      'Read-only social account data, served through perch (caching, rate limiting). Every endpoint also answers HEAD, and other methods with 405 E405.',
  },
  security: [{ apiKey: [] }],
  paths: {
    '/v1/users/{user_id}': operation('getUser', 'Fetch one user', [param('user_id')], 'User', 'User not found'),
    '/v1/users/by/username/{username}': operation('getUserByUsername', 'Fetch one user by username', [param('username')], 'User', 'User not found'),
    '/v1/users/{user_id}/tweets': operation('listTweets', "Page through a user's tweets", [param('user_id'), param('cursor')], 'TweetsPage', 'User not found'),
    '/v1/users/{user_id}/replies': operation('listReplies', "Page through a user's replies", [param('user_id'), param('cursor')], 'RepliesPage', 'User not found'),
    '/v1/users/{user_id}/following': operation(
      'listFollowing',
      'Page through the accounts a user follows',
      [param('user_id'), param('count'), param('cursor')],
      'FollowingPage',
      'User not found',
    ),
    '/v1/tweets/{tweet_id}': operation('getTweet', 'Fetch one tweet', [param('tweet_id')], 'TweetResponse', 'Tweet not found'),
  },
  components: {
    securitySchemes: { apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key' } },
    headers: {
      'X-Request-Id': {
        description: "The client's X-Request-Id when it matches [A-Za-z0-9._:-]{1,128}, else a new UUID",
        schema: { type: 'string' },
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
