import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { describe, it } from 'node:test';
import type { EndpointName, EndpointRequest, PathParams } from '../src/endpoints.js';
import { checkResponseBody } from '../src/schemas/response-check.js';
import { createFixtureUpstream } from '../src/upstream/fixture/fixture-upstream.js';
import { listedTweetId } from '../src/upstream/fixture/ids.js';
import type { UpstreamResult } from '../src/upstream/upstream.js';

/** A field type, an object of fields (exact key set), or a one-element array meaning "array of". */
type Shape = 'string' | 'number' | 'boolean' | readonly [Shape] | { readonly [key: string]: Shape };

const INDICES: Shape = ['number'];
const SIZE: Shape = { w: 'number', h: 'number', resize: 'string' };
const ENTITIES: Shape = {
  hashtags: [{ text: 'string', indices: INDICES }],
  urls: [{ url: 'string', expanded_url: 'string', display_url: 'string', indices: INDICES }],
  user_mentions: [{ screen_name: 'string', name: 'string', id_str: 'string', indices: INDICES }],
  media: [
    {
      id_str: 'string',
      media_url_https: 'string',
      url: 'string',
      display_url: 'string',
      expanded_url: 'string',
      type: 'string',
      sizes: { large: SIZE, medium: SIZE, small: SIZE, thumb: SIZE },
      indices: INDICES,
    },
  ],
};
const USER: Shape = {
  id: 'string',
  username: 'string',
  name: 'string',
  description: 'string',
  profile_image_url: 'string',
  profile_banner_url: 'string',
  followers_count: 'number',
  following_count: 'number',
  tweet_count: 'number',
  listed_count: 'number',
  verified: 'boolean',
  created_at: 'string',
  location: 'string',
  url: 'string',
  protected: 'boolean',
  pinned_tweet_ids: ['string'],
};
const LEGACY_TWEET = {
  created_at: 'string',
  id_str: 'string',
  full_text: 'string',
  favorite_count: 'number',
  retweet_count: 'number',
  reply_count: 'number',
  quote_count: 'number',
  entities: ENTITIES,
} as const;
const TWEETS_PAGE: Shape = { data: { entries: [{ legacy: LEGACY_TWEET }], cursor_bottom: 'string', has_more: 'boolean' } };
const TWEET: Shape = {
  data: { ...LEGACY_TWEET, user: { id_str: 'string', name: 'string', screen_name: 'string', profile_image_url_https: 'string' } },
};
const REPLY: Shape = {
  id: 'string',
  text: 'string',
  created_at: 'string',
  author: { id: 'string', username: 'string', name: 'string', profile_image_url: 'string', verified: 'boolean' },
  author_id: 'string',
  conversation_id: 'string',
  in_reply_to_user_id: 'string',
  stats: { retweet_count: 'number', reply_count: 'number', like_count: 'number', quote_count: 'number', view_count: 'number' },
  possibly_sensitive: 'boolean',
  lang: 'string',
  source: 'string',
};
const FOLLOWING_PAGE: Shape = {
  data: {
    users: [
      {
        result: {
          legacy: {
            id_str: 'string',
            name: 'string',
            screen_name: 'string',
            description: 'string',
            followers_count: 'number',
            friends_count: 'number',
            verified: 'boolean',
            profile_image_url_https: 'string',
          },
        },
      },
    ],
    cursor_bottom: 'string',
    cursor_top: 'string',
    has_more: 'boolean',
  },
};

function assertShape(value: unknown, shape: Shape, path = '$'): void {
  if (typeof shape === 'string') {
    assert.equal(typeof value, shape, `${path} should be a ${shape}`);
  } else if (Array.isArray(shape)) {
    assert.ok(Array.isArray(value), `${path} should be an array`);
    value.forEach((item, i) => assertShape(item, shape[0], `${path}[${i}]`));
  } else {
    assert.ok(typeof value === 'object' && value !== null && !Array.isArray(value), `${path} should be an object`);
    assert.deepEqual(Object.keys(value).sort(), Object.keys(shape).sort(), `${path} keys`);
    for (const [key, fieldShape] of Object.entries(shape)) assertShape((value as Record<string, unknown>)[key], fieldShape, `${path}.${key}`);
  }
}

interface Entities {
  hashtags: { text: string; indices: [number, number] }[];
  urls: { url: string; expanded_url: string; display_url: string; indices: [number, number] }[];
  user_mentions: { screen_name: string; name: string; id_str: string; indices: [number, number] }[];
  media: { id_str: string; url: string; indices: [number, number] }[];
}
interface User {
  id: string;
  username: string;
  name: string;
  description: string;
  profile_image_url: string;
  followers_count: number;
  following_count: number;
  verified: boolean;
  created_at: string;
  location: string;
  url: string;
  pinned_tweet_ids: string[];
}
interface LegacyTweet {
  created_at: string;
  id_str: string;
  full_text: string;
  favorite_count: number;
  retweet_count: number;
  reply_count: number;
  quote_count: number;
  entities: Entities;
}
interface TweetsPage {
  data: { entries: { legacy: LegacyTweet }[]; cursor_bottom: string; has_more: boolean };
}
interface Tweet {
  data: LegacyTweet & { user: { id_str: string; name: string; screen_name: string; profile_image_url_https: string } };
}
interface Reply {
  id: string;
  text: string;
  created_at: string;
  author: { id: string; username: string; name: string; profile_image_url: string; verified: boolean };
  author_id: string;
  conversation_id: string;
  in_reply_to_user_id: string;
  stats: { like_count: number; retweet_count: number };
}
interface RepliesPage {
  data: Reply[];
  meta: { result_count: number; next_token?: string };
}
interface FollowedUser {
  id_str: string;
  name: string;
  screen_name: string;
  description: string;
  followers_count: number;
  friends_count: number;
  verified: boolean;
  profile_image_url_https: string;
}
interface FollowingPage {
  data: { users: { result: { legacy: FollowedUser } }[]; cursor_bottom: string; cursor_top: string; has_more: boolean };
}

const upstream = createFixtureUpstream('fixture');

function request(endpoint: EndpointName, params: PathParams, extra: { count?: number; cursor?: string } = {}): EndpointRequest {
  return { endpoint, params, path: `/fixture/${endpoint}`, ...extra };
}

/** Fetches, requires an ok answer that passes perch's own response check, and returns the parsed body. */
async function fetchOk<T>(req: EndpointRequest, via: typeof upstream = upstream): Promise<T> {
  const result = await via.fetch(req);
  assert.equal(result.kind, 'ok', `${req.endpoint} ${JSON.stringify(req.params)} ${JSON.stringify(result)}`);
  const body: unknown = JSON.parse((result as Extract<UpstreamResult, { kind: 'ok' }>).body.toString('utf8'));
  assert.equal(checkResponseBody(req.endpoint, body), undefined, req.endpoint);
  return body as T;
}

const getUser = (userId: string): Promise<User> => fetchOk<User>(request('user', { user_id: userId }));
const getTweet = (tweetId: string): Promise<Tweet> => fetchOk<Tweet>(request('tweet', { tweet_id: tweetId }));

async function walkTweets(userId: string): Promise<{ pages: TweetsPage[]; items: LegacyTweet[] }> {
  const pages: TweetsPage[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await fetchOk<TweetsPage>(request('tweets', { user_id: userId }, cursor === undefined ? {} : { cursor }));
    pages.push(page);
    if (!page.data.has_more) break;
    cursor = page.data.cursor_bottom;
  }
  return { pages, items: pages.flatMap((page) => page.data.entries.map((entry) => entry.legacy)) };
}

async function walkReplies(userId: string): Promise<{ pages: RepliesPage[]; items: Reply[] }> {
  const pages: RepliesPage[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await fetchOk<RepliesPage>(request('replies', { user_id: userId }, cursor === undefined ? {} : { cursor }));
    pages.push(page);
    if (page.meta.next_token === undefined) break;
    cursor = page.meta.next_token;
  }
  return { pages, items: pages.flatMap((page) => page.data) };
}

async function walkFollowing(userId: string, count: number): Promise<{ pages: FollowingPage[]; items: FollowedUser[] }> {
  const pages: FollowingPage[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await fetchOk<FollowingPage>(request('following', { user_id: userId }, cursor === undefined ? { count } : { count, cursor }));
    pages.push(page);
    if (!page.data.has_more) break;
    cursor = page.data.cursor_bottom;
  }
  return { pages, items: pages.flatMap((page) => page.data.users.map((user) => user.result.legacy)) };
}

const TWITTER_DATE = /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{2} \d{2}:\d{2}:\d{2} \+0000 (\d{4})$/;

function assertTwitterDate(value: string): void {
  const match = TWITTER_DATE.exec(value);
  assert.ok(match, `created_at ${value}`);
  const year = Number(match[3]);
  assert.ok(year >= 2009 && year <= 2026, `year ${year}`);
  assert.equal(new Date(Date.parse(value)).toUTCString().slice(0, 3), value.slice(0, 3), `weekday of ${value}`);
}

function assertBigId(id: string): void {
  assert.match(id, /^[1-9]\d{18}$/);
  assert.ok(BigInt(id) > 2n ** 53n);
}

function codePointSlice(text: string, [start, end]: [number, number]): string {
  return [...text].slice(start, end).join('');
}

function assertEntityIndices(text: string, entities: Entities): void {
  for (const tag of entities.hashtags) assert.equal(codePointSlice(text, tag.indices), `#${tag.text}`, text);
  for (const mention of entities.user_mentions) assert.equal(codePointSlice(text, mention.indices), `@${mention.screen_name}`, text);
  for (const url of entities.urls) assert.equal(codePointSlice(text, url.indices), url.url, text);
  for (const media of entities.media) assert.equal(codePointSlice(text, media.indices), media.url, text);
}

/** Users whose lists span several pages and include the long ones. */
const SAMPLE_USERS = ['12', '7', '007', '2024', '44196397', '1234567890123456789', '99999999999999999999'];

describe('fixture upstream: users', () => {
  it('returns a User with every field of the spec, echoing the requested id', async () => {
    for (const userId of SAMPLE_USERS) {
      const user = await getUser(userId);
      assertShape(user, USER);
      assert.equal(user.id, userId);
      assertTwitterDate(user.created_at);
      user.pinned_tweet_ids.forEach(assertBigId);
    }
  });

  it('resolves every user it returns by username to the same id', async () => {
    const followed = await fetchOk<FollowingPage>(request('following', { user_id: '12' }, { count: 5 }));
    const ids = [...SAMPLE_USERS, ...followed.data.users.map((user) => user.result.legacy.id_str)];
    for (const userId of ids) {
      const user = await getUser(userId);
      const byName = await fetchOk<User>(request('user_by_username', { username: user.username }));
      assert.deepEqual(byName, user);
    }
  });

  it('answers any other username with that username and a stable generated id', async () => {
    for (const username of ['jack', 'bob_42', 'a', 'x'.repeat(50)]) {
      const user = await fetchOk<User>(request('user_by_username', { username }));
      assertShape(user, USER);
      assert.equal(user.username, username);
      assertBigId(user.id);
      assert.deepEqual(await fetchOk<User>(request('user_by_username', { username })), user);
    }
  });

  it('varies profiles, including empty description, location and url', async () => {
    const users = await Promise.all(Array.from({ length: 60 }, (_, i) => getUser(String(i + 1))));
    assert.ok(users.some((user) => user.description === ''));
    assert.ok(users.some((user) => user.description !== ''));
    assert.ok(users.some((user) => user.location === ''));
    assert.ok(users.some((user) => user.url === ''));
    assert.ok(users.some((user) => user.verified));
    assert.ok(users.some((user) => user.pinned_tweet_ids.length > 0));
    assert.ok(new Set(users.map((user) => user.username)).size === users.length);
  });

  it('pins a tweet that belongs to the user', async () => {
    for (let i = 1; i <= 30; i++) {
      const user = await getUser(String(i));
      for (const tweetId of user.pinned_tweet_ids) assert.equal((await getTweet(tweetId)).data.user.id_str, user.id);
    }
  });
});

describe('fixture upstream: tweets', () => {
  it('lists tweets in the spec shape, each fetchable by id with the same content and the user as author', async () => {
    for (const userId of SAMPLE_USERS.slice(0, 5)) {
      const { pages, items } = await walkTweets(userId);
      pages.forEach((page) => assertShape(page, TWEETS_PAGE));
      const user = await getUser(userId);
      for (const item of items) {
        assertBigId(item.id_str);
        assertTwitterDate(item.created_at);
        const tweet = await getTweet(item.id_str);
        assertShape(tweet, TWEET);
        const { user: author, ...legacy } = tweet.data;
        assert.deepEqual(legacy, item);
        assert.deepEqual(author, {
          id_str: userId,
          name: user.name,
          screen_name: user.username,
          profile_image_url_https: user.profile_image_url,
        });
      }
    }
  });

  it('lists tweets newest first', async () => {
    const { items } = await walkTweets('12');
    const times = items.map((item) => Date.parse(item.created_at));
    times.slice(1).forEach((time, i) => assert.ok(time < (times[i] ?? 0)));
  });

  it('answers any tweet id, echoing it, with a user that exists', async () => {
    for (const tweetId of ['1', '5', '20', '1234567890123456789', '99999999999999999999', '1000000000000000000']) {
      const tweet = await getTweet(tweetId);
      assertShape(tweet, TWEET);
      assert.equal(tweet.data.id_str, tweetId);
      const author = await getUser(tweet.data.user.id_str);
      assert.equal(author.username, tweet.data.user.screen_name);
    }
  });

  it('mentions users that exist under the mentioned name', async () => {
    const { items } = await walkTweets('44196397');
    const mentions = items.flatMap((item) => item.entities.user_mentions);
    assert.ok(mentions.length > 0);
    for (const mention of mentions.slice(0, 10)) {
      assertBigId(mention.id_str);
      const user = await getUser(mention.id_str);
      assert.equal(user.username, mention.screen_name);
      assert.equal(user.name, mention.name);
    }
  });
});

describe('fixture upstream: replies', () => {
  it('lists replies in the spec shape, each a tweet of the user answering an existing conversation', async () => {
    for (const userId of SAMPLE_USERS.slice(0, 4)) {
      const { pages, items } = await walkReplies(userId);
      const user = await getUser(userId);
      for (const page of pages) {
        assertShape(page.data, [REPLY]);
        assert.equal(page.meta.result_count, page.data.length);
        assertShape(page.meta, page.meta.next_token === undefined ? { result_count: 'number' } : { result_count: 'number', next_token: 'string' });
      }
      for (const reply of items) {
        assertBigId(reply.id);
        assertTwitterDate(reply.created_at);
        assert.equal(reply.author_id, userId);
        assert.deepEqual(reply.author, {
          id: userId,
          username: user.username,
          name: user.name,
          profile_image_url: user.profile_image_url,
          verified: user.verified,
        });
        const asTweet = await getTweet(reply.id);
        assert.equal(asTweet.data.user.id_str, userId);
        assert.equal(asTweet.data.full_text, reply.text);
        assert.equal(asTweet.data.favorite_count, reply.stats.like_count);
        const target = await getUser(reply.in_reply_to_user_id);
        assert.ok(reply.text.startsWith(`@${target.username} `));
        assert.equal((await getTweet(reply.conversation_id)).data.user.id_str, reply.in_reply_to_user_id);
      }
    }
  });
});

describe('fixture upstream: following', () => {
  it('lists followed users in the spec shape, each matching that user', async () => {
    const { pages, items } = await walkFollowing('12', 20);
    pages.forEach((page) => assertShape(page, FOLLOWING_PAGE));
    assert.equal(items.length, (await getUser('12')).following_count);
    for (const followed of items.slice(0, 25)) {
      assertBigId(followed.id_str);
      const user = await getUser(followed.id_str);
      assert.deepEqual(followed, {
        id_str: user.id,
        name: user.name,
        screen_name: user.username,
        description: user.description,
        followers_count: user.followers_count,
        friends_count: user.following_count,
        verified: user.verified,
        profile_image_url_https: user.profile_image_url,
      });
    }
  });

  it('respects count as the page size', async () => {
    for (const count of [1, 7, 20, 100]) {
      const { pages, items } = await walkFollowing('2024', count);
      pages.slice(0, -1).forEach((page) => assert.equal(page.data.users.length, count));
      assert.ok((pages.at(-1)?.data.users.length ?? 0) <= count);
      assert.equal(items.length, (await getUser('2024')).following_count);
    }
  });
});

describe('fixture upstream: pagination', () => {
  it('visits every item exactly once, in pages of 20, and ends', async () => {
    let longest = 0;
    for (const userId of SAMPLE_USERS) {
      const tweets = await walkTweets(userId);
      const replies = await walkReplies(userId);
      const following = await walkFollowing(userId, 20);
      for (const ids of [tweets.items.map((t) => t.id_str), replies.items.map((r) => r.id), following.items.map((u) => u.id_str)]) {
        assert.equal(new Set(ids).size, ids.length, 'no item twice');
        assert.ok(ids.length >= 3 && ids.length <= 150, `list length ${ids.length}`);
        longest = Math.max(longest, ids.length);
      }
      // Contiguous slots from the newest: a skipped or repeated item would break the sequence.
      const listed = (kind: 'tweets' | 'replies', n: number): string[] => Array.from({ length: n }, (_, i) => listedTweetId(userId, kind, i));
      assert.deepEqual(tweets.items.map((t) => t.id_str), listed('tweets', tweets.items.length));
      assert.deepEqual(replies.items.map((r) => r.id), listed('replies', replies.items.length));
      assert.equal(following.items.length, (await getUser(userId)).following_count);
      tweets.pages.slice(0, -1).forEach((page) => assert.equal(page.data.entries.length, 20));
      replies.pages.slice(0, -1).forEach((page) => assert.equal(page.data.length, 20));
      assert.equal(tweets.pages.at(-1)?.data.has_more, false);
      assert.equal(replies.pages.at(-1)?.meta.next_token, undefined);
      assert.equal(following.pages.at(-1)?.data.has_more, false);
    }
    assert.ok(longest > 60, 'some sampled list spans several pages');
  });

  it('gives first and last pages string cursors: top re-reads the first page, bottom of the last page is empty', async () => {
    const first = await fetchOk<FollowingPage>(request('following', { user_id: '7' }, { count: 5 }));
    assert.deepEqual(await fetchOk<FollowingPage>(request('following', { user_id: '7' }, { count: 5, cursor: first.data.cursor_top })), first);

    const { pages } = await walkFollowing('7', 5);
    const last = pages.at(-1);
    assert.ok(last !== undefined);
    const beyond = await fetchOk<FollowingPage>(request('following', { user_id: '7' }, { count: 5, cursor: last.data.cursor_bottom }));
    assert.deepEqual(beyond.data.users, []);
    assert.equal(beyond.data.has_more, false);

    const tweetsEnd = (await walkTweets('7')).pages.at(-1)?.data.cursor_bottom;
    assert.equal(typeof tweetsEnd, 'string');
    const afterTweets = await fetchOk<TweetsPage>(request('tweets', { user_id: '7' }, { cursor: tweetsEnd ?? '' }));
    assert.deepEqual(afterTweets.data.entries, []);
    assert.equal(afterTweets.data.has_more, false);
  });

  it('rejects cursors it did not issue for that list and user as bad_request', async () => {
    const tweetsPage = await fetchOk<TweetsPage>(request('tweets', { user_id: '12' }));
    const followingPage = await fetchOk<FollowingPage>(request('following', { user_id: '12' }, { count: 1 }));
    const cases: [EndpointName, string, string][] = [
      ['tweets', '12', 'garbage!'],
      ['tweets', '12', ''],
      ['tweets', '12', Buffer.from('v1:tweets:12:9999').toString('base64url')],
      ['tweets', '12', Buffer.from('v1:tweets:12:01').toString('base64url')],
      ['tweets', '12', `${tweetsPage.data.cursor_bottom}=`],
      ['tweets', '7', tweetsPage.data.cursor_bottom],
      ['replies', '12', tweetsPage.data.cursor_bottom],
      ['following', '12', tweetsPage.data.cursor_bottom],
      ['tweets', '12', followingPage.data.cursor_bottom],
      ['following', '012', followingPage.data.cursor_bottom],
    ];
    for (const [endpoint, userId, cursor] of cases) {
      const result = await upstream.fetch(request(endpoint, { user_id: userId }, { count: 20, cursor }));
      assert.equal(result.kind, 'bad_request', `${endpoint} ${userId} ${cursor}`);
      assert.equal(typeof (result as Extract<UpstreamResult, { kind: 'bad_request' }>).reason, 'string');
    }
  });
});

describe('fixture upstream: not found', () => {
  it('answers not_found for the reserved range on every endpoint', async () => {
    const requests = [
      ...['404', '4041234', '40400000000000000000'].flatMap((userId) =>
        (['user', 'tweets', 'replies', 'following'] as const).map((endpoint) => request(endpoint, { user_id: userId }, { count: 20 })),
      ),
      request('following', { user_id: '404' }, { count: 20, cursor: 'anything' }),
      request('user_by_username', { username: 'notfound' }),
      request('user_by_username', { username: 'notfound_anyone' }),
      request('tweet', { tweet_id: '404' }),
      request('tweet', { tweet_id: '4049999999999999999' }),
      request('tweet', { tweet_id: listedTweetId('40412', 'tweets', 0) }),
    ];
    for (const req of requests) assert.deepEqual(await upstream.fetch(req), { kind: 'not_found' }, JSON.stringify(req));
  });

  it('finds ids that merely contain 404', async () => {
    assert.equal((await getUser('1404')).id, '1404');
    assert.equal((await getTweet('1404')).data.id_str, '1404');
  });
});

describe('fixture upstream: text and entities', () => {
  it('places every entity at its code-point indices, over text with emoji, non-BMP characters and &amp;', async () => {
    const texts: { text: string; entities: Entities }[] = [];
    for (const userId of SAMPLE_USERS) {
      for (const item of (await walkTweets(userId)).items) texts.push({ text: item.full_text, entities: item.entities });
      for (const reply of (await walkReplies(userId)).items.slice(0, 30)) {
        const tweet = await getTweet(reply.id);
        texts.push({ text: tweet.data.full_text, entities: tweet.data.entities });
      }
    }
    for (const { text, entities } of texts) {
      assertShape(entities, ENTITIES);
      assertEntityIndices(text, entities);
      entities.media.forEach((media) => assertBigId(media.id_str));
    }
    const all = texts.map((entry) => entry.text);
    assert.ok(all.some((text) => text.includes('&amp;')), 'some text has &amp;');
    assert.ok(all.some((text) => /[\u{10000}-\u{10FFFF}]/u.test(text)), 'some text has a non-BMP character');
    const bmpThenEntity = texts.find(({ text, entities }) =>
      [...entities.hashtags, ...entities.urls, ...entities.user_mentions].some((e) => /[\u{10000}-\u{10FFFF}]/u.test([...text].slice(0, e.indices[0]).join(''))),
    );
    assert.ok(bmpThenEntity, 'some entity follows a non-BMP character, so UTF-16 indices would be wrong');
    for (const kind of ['hashtags', 'urls', 'user_mentions', 'media'] as const) {
      assert.ok(texts.some(({ entities }) => entities[kind].length > 0), `some tweet has ${kind}`);
    }
  });
});

const CROSS_PROCESS_REQUESTS: EndpointRequest[] = [
  request('user', { user_id: '12' }),
  request('user_by_username', { username: 'jack' }),
  request('tweets', { user_id: '44196397' }),
  request('replies', { user_id: '44196397' }),
  request('following', { user_id: '44196397' }, { count: 50 }),
  request('tweet', { tweet_id: '1234567890123456789' }),
];

describe('fixture upstream: determinism', () => {
  it('answers every request with the same bytes from a fresh instance', async () => {
    const other = createFixtureUpstream('other');
    const requests: EndpointRequest[] = [
      request('user', { user_id: '12' }),
      request('user_by_username', { username: 'jack' }),
      request('tweet', { tweet_id: '5' }),
      request('following', { user_id: '2024' }, { count: 3 }),
    ];
    const tweets = await walkTweets('2024');
    tweets.pages.slice(0, -1).forEach((page) => requests.push(request('tweets', { user_id: '2024' }, { cursor: page.data.cursor_bottom })));
    const replies = await walkReplies('2024');
    replies.pages.slice(0, -1).forEach((page) => requests.push(request('replies', { user_id: '2024' }, { cursor: page.meta.next_token ?? '' })));
    tweets.items.forEach((item) => requests.push(request('tweet', { tweet_id: item.id_str })));
    for (const req of requests) {
      const [a, b] = await Promise.all([upstream.fetch(req), other.fetch(req)]);
      assert.deepEqual(a, b);
      assert.equal(a.kind, 'ok');
    }
    await other.close();
  });

  it('answers the same bytes in another process', async () => {
    const moduleUrl = new URL('../src/upstream/fixture/fixture-upstream.js', import.meta.url).href;
    const script = `
      const { createFixtureUpstream } = await import(${JSON.stringify(moduleUrl)});
      const upstream = createFixtureUpstream('child');
      const requests = ${JSON.stringify(CROSS_PROCESS_REQUESTS)};
      const bodies = [];
      for (const req of requests) bodies.push((await upstream.fetch(req)).body.toString('base64'));
      process.stdout.write(JSON.stringify(bodies));
    `;
    const child = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' })) as string[];
    const here: string[] = [];
    for (const req of CROSS_PROCESS_REQUESTS) {
      const result = await upstream.fetch(req);
      assert.equal(result.kind, 'ok');
      here.push((result as Extract<UpstreamResult, { kind: 'ok' }>).body.toString('base64'));
    }
    assert.deepEqual(child, here);
  });

  it('keeps its name and closes immediately', async () => {
    const named = createFixtureUpstream('demo');
    assert.equal(named.name, 'demo');
    await named.close();
  });
});
