import { count, object, optionalList, optionalString, string, type Json } from './read.js';

/** A v1.1 entity's position: `[start, end)` in code points of the (HTML-escaped) text. */
type Indices = readonly [number, number];

/** The v1 `entities` of a tweet: the interface's four arrays, plus v1.1's `symbols` for cashtags. */
export interface V1Entities {
  readonly hashtags: readonly { text: string; indices: Indices }[];
  readonly urls: readonly { url: string; expanded_url: string; display_url: string; indices: Indices }[];
  readonly user_mentions: readonly { screen_name: string; id_str?: string; indices: Indices }[];
  readonly media: readonly V1Media[];
  readonly symbols: readonly { text: string; indices: Indices }[];
}

/** A v1.1 media entity, as far as v2 can fill it. */
export interface V1Media {
  readonly id_str: string;
  readonly type: string;
  readonly media_url_https: string;
  readonly url?: string;
  readonly display_url?: string;
  readonly expanded_url?: string;
  readonly indices?: Indices;
}

/**
 * A v2 tweet's `entities` and attached media to v1 entities. `start`/`end` become `indices`
 * unchanged: v2 offsets count code points, as v1.1 indices do, and both ends match (start
 * inclusive, end exclusive), so converting them to UTF-16 units would break every tweet with an
 * emoji before an entity. A URL entity with a `media_key` is the media's t.co link and, as in
 * v1.1, goes with the media rather than under `urls`. v2 `annotations` (end inclusive) have no v1
 * counterpart and are dropped. `at` names where `tweet.entities` came from, for a mapping error.
 */
export function mapEntities(tweet: Json, media: ReadonlyMap<string, MediaItem>, path: string, at = `${path}/entities`): V1Entities {
  const entities = tweet.entities === undefined ? {} : object(tweet.entities, at);
  const each = <T>(key: string, map: (entity: Json, here: string) => T): T[] =>
    optionalList(entities[key], `${at}/${key}`).map((entity, i) => map(object(entity, `${at}/${key}/${i}`), `${at}/${key}/${i}`));

  const links = each('urls', (u, here) => ({ entity: u, here, mediaKey: u.media_key === undefined ? undefined : string(u.media_key, `${here}/media_key`) }));
  const attached = optionalList(object(tweet.attachments ?? {}, `${path}/attachments`).media_keys, `${path}/attachments/media_keys`).map((key, i) =>
    string(key, `${path}/attachments/media_keys/${i}`),
  );
  return {
    hashtags: each('hashtags', (h, here) => ({ text: string(h.tag, `${here}/tag`), indices: indices(h, here) })),
    urls: links.filter((l) => l.mediaKey === undefined).map((l) => v1Url(l.entity, l.here)),
    user_mentions: each('mentions', (m, here) => ({
      screen_name: string(m.username, `${here}/username`),
      ...(m.id === undefined ? {} : { id_str: string(m.id, `${here}/id`) }),
      indices: indices(m, here),
    })),
    media: attached.map((key) => {
      const link = links.find((l) => l.mediaKey === key);
      return v1Media(key, media.get(key), link === undefined ? undefined : v1Url(link.entity, link.here));
    }),
    symbols: each('cashtags', (c, here) => ({ text: string(c.tag, `${here}/tag`), indices: indices(c, here) })),
  };
}

/** An expanded media object: its v1.1 type name (the same words in v2) and its image. */
export interface MediaItem {
  readonly type: string;
  readonly image: string;
}

/**
 * `includes.media` by `media_key`, for `mapEntities`. A photo's image is its `url`, a video's or
 * GIF's the `preview_image_url`, as v1.1's `media_url_https` was.
 */
export function mediaByKey(body: Json): Map<string, MediaItem> {
  const includes = body.includes === undefined ? {} : object(body.includes, '/includes');
  return new Map(
    optionalList(includes.media, '/includes/media').map((m, i) => {
      const here = `/includes/media/${i}`;
      const item = object(m, here);
      const image = item.url === undefined ? optionalString(item.preview_image_url, `${here}/preview_image_url`) : string(item.url, `${here}/url`);
      return [string(item.media_key, `${here}/media_key`), { type: string(item.type, `${here}/type`), image }];
    }),
  );
}

function indices(entity: Json, here: string): Indices {
  return [count(entity.start, `${here}/start`), count(entity.end, `${here}/end`)];
}

function v1Url(entity: Json, here: string): V1Entities['urls'][number] {
  const url = string(entity.url, `${here}/url`);
  return {
    url,
    expanded_url: entity.expanded_url === undefined ? url : string(entity.expanded_url, `${here}/expanded_url`),
    display_url: entity.display_url === undefined ? url : string(entity.display_url, `${here}/display_url`),
    indices: indices(entity, here),
  };
}

/**
 * v2 media keys are `<type digit>_<media id>`; the id is v1.1's `id_str`. Media X did not expand
 * (withheld, or deleted since) keeps its id with an empty image rather than failing the tweet.
 */
function v1Media(key: string, item: MediaItem | undefined, link: V1Entities['urls'][number] | undefined): V1Media {
  return {
    id_str: key.slice(key.indexOf('_') + 1),
    type: item?.type ?? 'photo',
    media_url_https: item?.image ?? '',
    ...(link === undefined ? {} : link),
  };
}
