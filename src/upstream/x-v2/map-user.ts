import { count, object, optionalBoolean, optionalString, string, type Json } from './read.js';
import { twitterDate } from './twitter-date.js';

/** The interface's user (section 2.1), top level, no `data` wrapper. */
export interface V1User {
  readonly id: string;
  readonly username: string;
  readonly name: string;
  readonly description: string;
  readonly profile_image_url: string;
  readonly profile_banner_url: string;
  readonly followers_count: number;
  readonly following_count: number;
  readonly tweet_count: number;
  readonly listed_count: number;
  readonly verified: boolean;
  readonly created_at: string;
  readonly location: string;
  readonly url: string;
  readonly protected: boolean;
  readonly pinned_tweet_ids: readonly string[];
}

/**
 * `GET /2/users/:id` or `/2/users/by/username/:username` to a v1 user. Fields X leaves out
 * because the user never set them (banner, location, url, description) become "", `verified`
 * and `protected` false; `pinned_tweet_id` becomes a list of zero or one id. `url` stays X's
 * t.co link, as v1.1's did.
 */
export function mapUser(body: unknown): V1User {
  return v1User(object(object(body, '').data, '/data'), '/data');
}

/** One v2 user object at `path` (with the user fields perch asks for) to a v1 user. */
export function v1User(user: Json, path: string): V1User {
  const metrics = object(user.public_metrics, `${path}/public_metrics`);
  const at = (key: string) => `${path}/${key}`;
  const pinned = user.pinned_tweet_id;
  return {
    id: string(user.id, at('id')),
    username: string(user.username, at('username')),
    name: string(user.name, at('name')),
    description: optionalString(user.description, at('description')),
    profile_image_url: optionalString(user.profile_image_url, at('profile_image_url')),
    profile_banner_url: optionalString(user.profile_banner_url, at('profile_banner_url')),
    followers_count: count(metrics.followers_count, at('public_metrics/followers_count')),
    following_count: count(metrics.following_count, at('public_metrics/following_count')),
    tweet_count: count(metrics.tweet_count, at('public_metrics/tweet_count')),
    listed_count: count(metrics.listed_count, at('public_metrics/listed_count')),
    verified: optionalBoolean(user.verified, at('verified')),
    created_at: twitterDate(user.created_at, at('created_at')),
    location: optionalString(user.location, at('location')),
    url: optionalString(user.url, at('url')),
    protected: optionalBoolean(user.protected, at('protected')),
    pinned_tweet_ids: pinned === undefined ? [] : [string(pinned, at('pinned_tweet_id'))],
  };
}
