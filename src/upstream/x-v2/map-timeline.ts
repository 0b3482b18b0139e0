import { mediaByKey } from './map-entities.js';
import { legacyTweet, type V1LegacyTweet } from './map-tweet.js';
import { object, optionalList, string } from './read.js';

/** `GET /v1/users/{id}/tweets`'s body (section 4.3). */
export interface V1TweetsPage {
  readonly data: { readonly entries: readonly { readonly legacy: V1LegacyTweet }[]; readonly cursor_bottom: string; readonly has_more: boolean };
}

/**
 * One page of `GET /2/users/:id/tweets` to one v1 page, newest first as X orders it.
 * `cursor_bottom` is X's `meta.next_token` as it is (perch sends it back as `pagination_token`),
 * and "" on the last page, where X gives none and `has_more` is false. An empty timeline
 * (`{"meta":{"result_count":0}}`) is an empty last page.
 */
export function mapTimeline(body: unknown): V1TweetsPage {
  const top = object(body, '');
  const media = mediaByKey(top);
  const next = nextToken(top);
  return {
    data: {
      entries: optionalList(top.data, '/data').map((t, i) => ({ legacy: legacyTweet(object(t, `/data/${i}`), media, `/data/${i}`) })),
      cursor_bottom: next ?? '',
      has_more: next !== undefined,
    },
  };
}

/** X's `meta.next_token`: absent on the last page. */
export function nextToken(top: Readonly<Record<string, unknown>>): string | undefined {
  const meta = top.meta === undefined ? {} : object(top.meta, '/meta');
  return meta.next_token === undefined ? undefined : string(meta.next_token, '/meta/next_token');
}
