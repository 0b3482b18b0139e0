import { nextToken } from './map-timeline.js';
import { fullText } from './map-tweet.js';
import { MappingGap, object, optionalBoolean, optionalCount, optionalList, optionalString, string, type Json } from './read.js';
import { REPLIES_SOURCE } from './replies-source.js';
import { twitterDate } from './twitter-date.js';

/** An element of `data` of the v1 replies listing (section 2.2). */
export interface V1Reply {
  readonly id: string;
  readonly text: string;
  readonly created_at: string;
  readonly author: { readonly id: string; readonly username: string; readonly name: string; readonly profile_image_url: string; readonly verified: boolean };
  readonly author_id: string;
  readonly conversation_id: string;
  readonly in_reply_to_user_id: string;
  readonly stats: { readonly retweet_count: number; readonly reply_count: number; readonly like_count: number; readonly quote_count: number; readonly view_count: number };
  readonly possibly_sensitive: boolean;
  readonly lang: string;
  readonly source: string;
}

/** `GET /v1/users/{id}/replies`'s body (section 4.4). */
export interface V1RepliesPage {
  readonly data: readonly V1Reply[];
  readonly meta: { readonly result_count: number; readonly next_token?: string };
}

/**
 * One page of the replies source (see replies-source.ts) to one v1 page: the replies among its
 * tweets, `meta.next_token` X's own (absent on the last page), `result_count` the replies kept.
 * `view_count` is `public_metrics.impression_count` (0 where X leaves it out); `source` is ""
 * because v2 no longer returns it.
 */
export function mapReplies(body: unknown): V1RepliesPage {
  const top = object(body, '');
  const authors = usersById(top);
  const data = optionalList(top.data, '/data')
    .map((t, i) => ({ tweet: object(t, `/data/${i}`), at: `/data/${i}` }))
    .filter(({ tweet }) => REPLIES_SOURCE.keep(tweet))
    .map(({ tweet, at }) => v1Reply(tweet, authors, at));
  const next = nextToken(top);
  return { data, meta: next === undefined ? { result_count: data.length } : { result_count: data.length, next_token: next } };
}

function v1Reply(tweet: Json, authors: ReadonlyMap<string, V1Reply['author']>, at: string): V1Reply {
  const authorId = string(tweet.author_id, `${at}/author_id`);
  const author = authors.get(authorId);
  if (author === undefined) throw new MappingGap(`/includes/users has no entry for ${at}/author_id`);
  const metrics = object(tweet.public_metrics, `${at}/public_metrics`);
  const m = (key: string) => optionalCount(metrics[key], `${at}/public_metrics/${key}`);
  return {
    id: string(tweet.id, `${at}/id`),
    text: fullText(tweet, at).text,
    created_at: twitterDate(tweet.created_at, `${at}/created_at`),
    author,
    author_id: authorId,
    conversation_id: string(tweet.conversation_id, `${at}/conversation_id`),
    in_reply_to_user_id: string(tweet.in_reply_to_user_id, `${at}/in_reply_to_user_id`),
    stats: { retweet_count: m('retweet_count'), reply_count: m('reply_count'), like_count: m('like_count'), quote_count: m('quote_count'), view_count: m('impression_count') },
    possibly_sensitive: optionalBoolean(tweet.possibly_sensitive, `${at}/possibly_sensitive`),
    lang: optionalString(tweet.lang, `${at}/lang`),
    source: optionalString(tweet.source, `${at}/source`),
  };
}

/** `includes.users` (from `expansions=author_id`) as the reply's `author` objects. */
function usersById(top: Json): Map<string, V1Reply['author']> {
  const includes = top.includes === undefined ? {} : object(top.includes, '/includes');
  return new Map(
    optionalList(includes.users, '/includes/users').map((u, i) => {
      const at = `/includes/users/${i}`;
      const user = object(u, at);
      const id = string(user.id, `${at}/id`);
      return [
        id,
        {
          id,
          username: string(user.username, `${at}/username`),
          name: string(user.name, `${at}/name`),
          profile_image_url: optionalString(user.profile_image_url, `${at}/profile_image_url`),
          verified: optionalBoolean(user.verified, `${at}/verified`),
        },
      ];
    }),
  );
}
