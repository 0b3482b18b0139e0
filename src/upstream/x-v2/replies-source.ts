import type { Json } from './read.js';
import { v2Path } from './query-string.js';

/** Where a user's replies come from: the v2 request for one page, and which tweets of it to keep. */
export interface RepliesSource {
  path(userId: string, cursor: string | undefined): string;
  keep(tweet: Json): boolean;
}

/** Timeline tweets read per page: X's maximum, so a page yields as many replies as it can. */
const TIMELINE_PAGE = 100;

/**
 * The one place the choice of source is made.
 *
 * v2 has no replies endpoint. The interface's replies are the user's own (`author`, with
 * `in_reply_to_user_id` the user being replied to), which rules out the mentions timeline
 * (other people's tweets to the user). Recent search (`from:<id> is:reply`) sees 7 days only and
 * needs a paid plan. So perch reads the user's own timeline, `GET /2/users/:id/tweets` without
 * retweets (never the user's own replies), and keeps the tweets that reply to a user: every
 * reply among the latest 3,200 tweets, newest first, at the cost of pages that hold fewer
 * replies than tweets read, or none while `next_token` says more follow.
 */
export const REPLIES_SOURCE: RepliesSource = {
  path: (userId, cursor) =>
    v2Path(`/2/users/${userId}/tweets`, {
      max_results: TIMELINE_PAGE,
      pagination_token: cursor,
      exclude: 'retweets',
      'tweet.fields': 'author_id,conversation_id,created_at,in_reply_to_user_id,lang,note_tweet,possibly_sensitive,public_metrics',
      expansions: 'author_id',
      'user.fields': 'profile_image_url,verified',
    }),
  // The one field v2 sets on replies only.
  keep: (tweet) => typeof tweet.in_reply_to_user_id === 'string',
};

/**
 * Replies read `GET /2/users/:id/tweets`, the tweets endpoint's request and so its X rate-limit
 * window: a stop X gives either endpoint holds both.
 */
export const X_SHARED_WINDOWS: Readonly<Record<string, string>> = { replies: 'tweets' };
