import type { EndpointRequest } from '../../endpoints.js';
import { v2Path } from './query-string.js';
import { REPLIES_SOURCE } from './replies-source.js';

/** The user fields behind every field of the interface's user. */
const USER_FIELDS = 'created_at,description,location,pinned_tweet_id,profile_image_url,profile_banner_url,protected,public_metrics,url,verified';
/**
 * What a tweet needs for v1's counts, text and entities (media come through the expansion).
 * `note_tweet` carries the whole text of a post longer than 280 characters, whose `text` X cuts.
 */
const TWEET_FIELDS = 'attachments,created_at,entities,note_tweet,public_metrics';
const MEDIA_FIELDS = 'preview_image_url,type,url';
/**
 * Tweets per page of a user's tweets. The interface gives that listing no count, X defaults to
 * 10 (5-100): perch asks for 20, the page size of its fixture and of v1.1's timelines.
 */
export const TWEETS_PAGE_SIZE = 20;
/** The v1 following listing's default `count`, which X (1-1000, default 100) must be told. */
const FOLLOWING_DEFAULT_COUNT = 20;

/** The query of each lookup, single or batch: the same fields and expansions either way. */
const LOOKUP_QUERY = {
  user: { 'user.fields': USER_FIELDS },
  user_by_username: { 'user.fields': USER_FIELDS },
  tweet: {
    'tweet.fields': `author_id,${TWEET_FIELDS}`,
    expansions: 'author_id,attachments.media_keys',
    'media.fields': MEDIA_FIELDS,
    'user.fields': 'profile_image_url',
  },
} as const;

/** The endpoints X answers for many items at once, and the parameter that lists them. */
export type BatchEndpoint = keyof typeof LOOKUP_QUERY;
export const BATCH_PARAMETER: Readonly<Record<BatchEndpoint, 'ids' | 'usernames'>> = { user: 'ids', user_by_username: 'usernames', tweet: 'ids' };
const BATCH_PATH: Readonly<Record<BatchEndpoint, string>> = { user: '/2/users', user_by_username: '/2/users/by', tweet: '/2/tweets' };

/** The item a lookup asks for: the id, or the username as X compares it (case-insensitively). */
export function itemOf(request: EndpointRequest): string {
  const { user_id: userId, username, tweet_id: tweetId } = request.params;
  return request.endpoint === 'user_by_username' ? (username ?? '').toLowerCase() : (userId ?? tweetId ?? '');
}

/**
 * The batch lookup for several requests of one endpoint (`user`, `user_by_username` or
 * `tweet`): `/2/users?ids=`, `/2/users/by?usernames=` or `/2/tweets?ids=`, with the single
 * lookup's fields. Ids and usernames are X-valid (known-answer.ts turned the others away), so
 * the list needs no escaping.
 */
export function v2BatchRequest(requests: readonly EndpointRequest[]): string {
  const endpoint = requests[0]!.endpoint as BatchEndpoint;
  const items = requests.map((r) => r.params.user_id ?? r.params.username ?? r.params.tweet_id);
  return v2Path(BATCH_PATH[endpoint], { [BATCH_PARAMETER[endpoint]]: items.join(','), ...LOOKUP_QUERY[endpoint] });
}

/** The X API v2 path and query answering a validated v1 request. */
export function v2Request(request: EndpointRequest): string {
  const { user_id: userId = '', username = '', tweet_id: tweetId = '' } = request.params;
  switch (request.endpoint) {
    case 'user':
      return v2Path(`/2/users/${userId}`, LOOKUP_QUERY.user);
    case 'user_by_username':
      return v2Path(`/2/users/by/username/${username}`, LOOKUP_QUERY.user_by_username);
    case 'tweet':
      return v2Path(`/2/tweets/${tweetId}`, LOOKUP_QUERY.tweet);
    case 'tweets':
      return v2Path(`/2/users/${userId}/tweets`, {
        max_results: TWEETS_PAGE_SIZE,
        pagination_token: request.cursor,
        'tweet.fields': TWEET_FIELDS,
        expansions: 'attachments.media_keys',
        'media.fields': MEDIA_FIELDS,
      });
    case 'replies':
      return REPLIES_SOURCE.path(userId, request.cursor);
    case 'following':
      // v1's count is 1-100, within X's 1-1000, so it goes over as it is.
      return v2Path(`/2/users/${userId}/following`, {
        max_results: request.count ?? FOLLOWING_DEFAULT_COUNT,
        pagination_token: request.cursor,
        'user.fields': 'description,profile_image_url,public_metrics,verified',
      });
  }
}
