import type { EndpointName } from '../endpoints.js';

/**
 * JSON Schemas (draft 2020-12, as OpenAPI 3.1 uses) of the interface's resources, following the
 * field tables of the interface specification. They are the one source of both the OpenAPI
 * document served at `/openapi.json` and the compiled check of every upstream 2xx body
 * (response-check.ts), so what perch documents and what it lets into its cache cannot drift.
 * Fields the specification lists are required; extra fields are allowed, because perch passes
 * provider bodies through and a provider may add fields without breaking clients.
 */

const str = { type: 'string' } as const;
const num = { type: 'number' } as const;
const bool = { type: 'boolean' } as const;
const digits = { type: 'string', pattern: '^[0-9]+$' } as const;
// The specification's shape: <weekday-abbrev> <month-abbrev> <DD> <HH:MM:SS> +0000 <YYYY>.
const twitterDate = { type: 'string', pattern: '^[A-Z][a-z]{2} [A-Z][a-z]{2} \\d{2} \\d{2}:\\d{2}:\\d{2} \\+0000 \\d{4}$' } as const;
const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` }) as const;

function object(properties: Record<string, unknown>, required: string[] = Object.keys(properties)): object {
  return { type: 'object', properties, required };
}

// [start, end) offsets of an entity in the text, in code points (not UTF-16 units), as Twitter's.
const indices = {
  type: 'array',
  items: { type: 'integer', minimum: 0 },
  minItems: 2,
  maxItems: 2,
  description: 'Start and end (exclusive) of the entity in the text, in Unicode code points',
} as const;

// `indices` is described but not required: the interface's tables do not list it.
const entities = object({
  hashtags: { type: 'array', items: object({ text: str, indices }, []) },
  urls: { type: 'array', items: object({ url: str, expanded_url: str, display_url: str, indices }, ['url', 'expanded_url', 'display_url']) },
  user_mentions: { type: 'array', items: object({ screen_name: str, indices }, []) },
  media: { type: 'array', items: object({ indices }, []) },
});

const tweetCounts = {
  created_at: str,
  id_str: digits,
  full_text: str,
  favorite_count: num,
  retweet_count: num,
  reply_count: num,
  quote_count: num,
};

export const SCHEMAS = {
  Error: {
    type: 'object',
    properties: {
      error: object({ message: str, code: { type: 'string', enum: ['E400', 'E401', 'E404', 'E405', 'E408', 'E417', 'E429', 'E431', 'E500', 'E502', 'E504'] } }),
    },
    required: ['error'],
    additionalProperties: false,
  },
  User: object({
    id: digits,
    username: str,
    name: str,
    description: str,
    profile_image_url: str,
    profile_banner_url: str,
    followers_count: num,
    following_count: num,
    tweet_count: num,
    listed_count: num,
    verified: bool,
    created_at: twitterDate,
    location: str,
    url: str,
    protected: bool,
    pinned_tweet_ids: { type: 'array', items: digits },
  }),
  Entities: entities,
  TweetListEntry: object({ legacy: object({ ...tweetCounts, entities: ref('Entities') }) }),
  TweetsPage: object({
    data: object({ entries: { type: 'array', items: ref('TweetListEntry') }, cursor_bottom: str, has_more: bool }),
  }),
  Reply: object({
    id: digits,
    text: str,
    created_at: twitterDate,
    // "In the same format as the user response"; the specification's example carries these five.
    author: object({ id: digits, username: str, name: str, profile_image_url: str, verified: bool }),
    author_id: digits,
    conversation_id: digits,
    in_reply_to_user_id: digits,
    stats: object({ retweet_count: num, reply_count: num, like_count: num, quote_count: num, view_count: num }),
    possibly_sensitive: bool,
    lang: str,
    source: str,
  }),
  RepliesPage: object(
    {
      data: { type: 'array', items: ref('Reply') },
      // next_token is absent on the last page.
      meta: object({ result_count: num, next_token: str }, ['result_count']),
    },
    ['data', 'meta'],
  ),
  FollowingEntry: object({
    result: object({
      legacy: object({
        id_str: digits,
        name: str,
        screen_name: str,
        description: str,
        followers_count: num,
        friends_count: num,
        verified: bool,
        profile_image_url_https: str,
      }),
    }),
  }),
  FollowingPage: object({
    data: object({ users: { type: 'array', items: ref('FollowingEntry') }, cursor_bottom: str, cursor_top: str, has_more: bool }),
  }),
  Tweet: object({
    ...tweetCounts,
    user: object({ id_str: digits, name: str, screen_name: str, profile_image_url_https: str }),
    entities: ref('Entities'),
  }),
  TweetResponse: object({ data: ref('Tweet') }),
} as const;

/** The schema of each endpoint's 200 body, by name under `components.schemas`. */
export const RESPONSE_SCHEMA: Readonly<Record<EndpointName, keyof typeof SCHEMAS>> = {
  user: 'User',
  user_by_username: 'User',
  tweets: 'TweetsPage',
  replies: 'RepliesPage',
  following: 'FollowingPage',
  tweet: 'TweetResponse',
};
