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

/** The X API v2 path and query answering a validated v1 request. */
export function v2Request(request: EndpointRequest): string {
  const { user_id: userId = '', username = '', tweet_id: tweetId = '' } = request.params;
  switch (request.endpoint) {
    case 'user':
      return v2Path(`/2/users/${userId}`, { 'user.fields': USER_FIELDS });
    case 'user_by_username':
      return v2Path(`/2/users/by/username/${username}`, { 'user.fields': USER_FIELDS });
    case 'tweet':
      return v2Path(`/2/tweets/${tweetId}`, {
        'tweet.fields': `author_id,${TWEET_FIELDS}`,
        expansions: 'author_id,attachments.media_keys',
        'media.fields': MEDIA_FIELDS,
        'user.fields': 'profile_image_url',
      });
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
