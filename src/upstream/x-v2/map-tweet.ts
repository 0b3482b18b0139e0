import { mapEntities, mediaByKey, type MediaItem, type V1Entities } from './map-entities.js';
import { MappingGap, object, optionalList, optionalCount, optionalString, string, type Json } from './read.js';
import { twitterDate } from './twitter-date.js';

/** The counts and text every v1 tweet carries, in a list entry's `legacy` and under `data`. */
export interface V1LegacyTweet {
  readonly created_at: string;
  readonly id_str: string;
  readonly full_text: string;
  readonly favorite_count: number;
  readonly retweet_count: number;
  readonly reply_count: number;
  readonly quote_count: number;
  readonly entities: V1Entities;
}

/** `GET /v1/tweets/{id}`'s body (section 2.3). */
export interface V1TweetBody {
  readonly data: V1LegacyTweet & {
    readonly user: { readonly id_str: string; readonly name: string; readonly screen_name: string; readonly profile_image_url_https: string };
  };
}

/**
 * `GET /2/tweets/:id` (with `expansions=author_id,attachments.media_keys`) to the v1 tweet: the
 * author comes from `includes.users`, and a tweet whose author X did not include cannot be
 * mapped.
 */
export function mapTweet(body: unknown): V1TweetBody {
  const top = object(body, '');
  const tweet = object(top.data, '/data');
  const authorId = string(tweet.author_id, '/data/author_id');
  const users = optionalList(top.includes === undefined ? undefined : object(top.includes, '/includes').users, '/includes/users');
  const index = users.findIndex((u) => typeof u === 'object' && u !== null && (u as Json).id === authorId);
  if (index < 0) throw new MappingGap('/includes/users has no entry for /data/author_id');
  const author = object(users[index], `/includes/users/${index}`);
  const at = `/includes/users/${index}`;
  return {
    data: {
      ...legacyTweet(tweet, mediaByKey(top), '/data'),
      user: {
        id_str: authorId,
        name: string(author.name, `${at}/name`),
        screen_name: string(author.username, `${at}/username`),
        profile_image_url_https: optionalString(author.profile_image_url, `${at}/profile_image_url`),
      },
    },
  };
}

/**
 * One v2 tweet at `path` to v1's fields: `text` becomes `full_text` as it is (X escapes `&`, `<`
 * and `>` in v2 as in v1.1), `like_count` becomes `favorite_count`. A post longer than 280
 * characters is cut in `text`; its whole text and the entities counted in it are `note_tweet`'s,
 * which then replace both (see `fullText`).
 */
export function legacyTweet(tweet: Json, media: ReadonlyMap<string, MediaItem>, path: string): V1LegacyTweet {
  const metrics = object(tweet.public_metrics, `${path}/public_metrics`);
  const m = (key: string) => optionalCount(metrics[key], `${path}/public_metrics/${key}`);
  const { text, entities, entitiesAt } = fullText(tweet, path);
  return {
    created_at: twitterDate(tweet.created_at, `${path}/created_at`),
    id_str: string(tweet.id, `${path}/id`),
    full_text: text,
    favorite_count: m('like_count'),
    retweet_count: m('retweet_count'),
    reply_count: m('reply_count'),
    quote_count: m('quote_count'),
    entities: mapEntities(entities, media, path, entitiesAt),
  };
}

/**
 * The tweet's whole text and the object whose `entities` index into it (with the tweet's
 * `attachments`): `note_tweet`'s when X sent one, else the tweet's own. The entities of the cut
 * `text` index into a text the client never sees, so none of them is kept beside the note's;
 * the media link among them goes too, while the media themselves stay (from `attachments`).
 */
export function fullText(tweet: Json, path: string): { readonly text: string; readonly entities: Json; readonly entitiesAt: string } {
  if (tweet.note_tweet === undefined) return { text: string(tweet.text, `${path}/text`), entities: tweet, entitiesAt: `${path}/entities` };
  const at = `${path}/note_tweet`;
  const note = object(tweet.note_tweet, at);
  return { text: string(note.text, `${at}/text`), entities: { entities: note.entities, attachments: tweet.attachments }, entitiesAt: `${at}/entities` };
}
