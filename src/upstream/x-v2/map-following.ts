import { nextToken } from './map-timeline.js';
import { count, object, optionalBoolean, optionalList, optionalString, string } from './read.js';

/** An entry of `data.users` of the v1 following listing (section 2.5). */
export interface V1FollowingEntry {
  readonly result: {
    readonly legacy: {
      readonly id_str: string;
      readonly name: string;
      readonly screen_name: string;
      readonly description: string;
      readonly followers_count: number;
      readonly friends_count: number;
      readonly verified: boolean;
      readonly profile_image_url_https: string;
    };
  };
}

/** `GET /v1/users/{id}/following`'s body (section 4.5). */
export interface V1FollowingPage {
  readonly data: { readonly users: readonly V1FollowingEntry[]; readonly cursor_bottom: string; readonly cursor_top: string; readonly has_more: boolean };
}

/**
 * One page of `GET /2/users/:id/following` to one v1 page: `following_count` becomes v1.1's
 * `friends_count`. `cursor_bottom` is X's `meta.next_token` ("" on the last page, with
 * `has_more` false) and `cursor_top` its `meta.previous_token` ("" on the first): X takes either
 * back as `pagination_token`.
 */
export function mapFollowing(body: unknown): V1FollowingPage {
  const top = object(body, '');
  const next = nextToken(top);
  const meta = top.meta === undefined ? {} : object(top.meta, '/meta');
  return {
    data: {
      users: optionalList(top.data, '/data').map((u, i) => {
        const at = `/data/${i}`;
        const user = object(u, at);
        const metrics = object(user.public_metrics, `${at}/public_metrics`);
        return {
          result: {
            legacy: {
              id_str: string(user.id, `${at}/id`),
              name: string(user.name, `${at}/name`),
              screen_name: string(user.username, `${at}/username`),
              description: optionalString(user.description, `${at}/description`),
              followers_count: count(metrics.followers_count, `${at}/public_metrics/followers_count`),
              friends_count: count(metrics.following_count, `${at}/public_metrics/following_count`),
              verified: optionalBoolean(user.verified, `${at}/verified`),
              profile_image_url_https: optionalString(user.profile_image_url, `${at}/profile_image_url`),
            },
          },
        };
      }),
      cursor_bottom: next ?? '',
      cursor_top: optionalString(meta.previous_token, '/meta/previous_token'),
      has_more: next !== undefined,
    },
  };
}
