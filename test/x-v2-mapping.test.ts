import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { checkResponseBody } from '../src/schemas/response-check.js';
import { mapFollowing } from '../src/upstream/x-v2/map-following.js';
import { mapReplies } from '../src/upstream/x-v2/map-replies.js';
import { mapTimeline } from '../src/upstream/x-v2/map-timeline.js';
import { mapTweet } from '../src/upstream/x-v2/map-tweet.js';
import { mapUser } from '../src/upstream/x-v2/map-user.js';
import { outcomeOf } from '../src/upstream/x-v2/outcome.js';
import { MappingError } from '../src/upstream/x-v2/read.js';
import { xFixture } from './helpers/x-v2-fixtures.js';

/** The code points of `text` from `start` to `end`, the way v1.1 clients slice with indices. */
function slice(text: string, [start, end]: readonly [number, number]): string {
  return [...text].slice(start, end).join('');
}

describe('x_v2 mapping: users', { timeout: 10_000 }, () => {
  it('maps every field of a full user, dates to the v1 form and metrics flattened', () => {
    const user = mapUser(xFixture('user'));
    assert.deepEqual(user, {
      id: '2244994945',
      username: 'XDevelopers',
      name: 'Developers 🛠️',
      description: 'The voice of the X Dev team & your official source for updates, news, and events, related to the X API.',
      profile_image_url: 'https://pbs.twimg.com/profile_images/1683501992314798080/xl1POYLw_normal.jpg',
      profile_banner_url: 'https://pbs.twimg.com/profile_banners/2244994945/1690213128',
      followers_count: 583423,
      following_count: 2048,
      tweet_count: 14052,
      listed_count: 1672,
      verified: true,
      created_at: 'Sat Dec 14 04:35:55 +0000 2013',
      location: '127.0.0.1',
      url: 'https://t.co/3ZX3TNiZCY',
      protected: false,
      pinned_tweet_ids: ['1722701605825642574'],
    });
    assert.equal(checkResponseBody('user', user), undefined);
  });

  it('fills what a sparse user leaves out with "" and [], never null', () => {
    const user = mapUser(xFixture('user-sparse'));
    assert.deepEqual(
      [user.description, user.profile_banner_url, user.location, user.url, user.pinned_tweet_ids, user.protected, user.created_at],
      ['', '', '', '', [], true, 'Tue Nov 16 01:02:03 +0000 2021'],
    );
    assert.equal(checkResponseBody('user_by_username', user), undefined);
  });

  it('refuses a user without public_metrics, naming the path and no value', () => {
    const body = xFixture('user');
    delete body.data.public_metrics;
    assert.throws(() => mapUser(body), (e: unknown) => e instanceof MappingError && e.message === '/data/public_metrics must be object');
    body.data.public_metrics = { followers_count: '1', following_count: 1, tweet_count: 1, listed_count: 1 };
    assert.throws(() => mapUser(body), { message: '/data/public_metrics/followers_count must be number' });
  });

  it('refuses a created_at that is not ISO 8601 UTC', () => {
    const body = xFixture('user');
    body.data.created_at = 'Sat Dec 14 04:35:55 +0000 2013';
    assert.throws(() => mapUser(body), { message: '/data/created_at must be an ISO 8601 UTC date-time' });
  });
});

describe('x_v2 mapping: a tweet', { timeout: 10_000 }, () => {
  it('maps text, counts, author and every entity kind', () => {
    const v2 = xFixture('tweet');
    const body = mapTweet(v2);
    const tweet = body.data;
    assert.deepEqual(
      [tweet.created_at, tweet.id_str, tweet.full_text, tweet.favorite_count, tweet.retweet_count, tweet.reply_count, tweet.quote_count],
      ['Thu Nov 09 19:45:02 +0000 2023', '1722701605825642574', v2.data.text, 305, 41, 12, 7],
    );
    assert.deepEqual(tweet.user, {
      id_str: '2244994945',
      name: 'Developers 🛠️',
      screen_name: 'XDevelopers',
      profile_image_url_https: 'https://pbs.twimg.com/profile_images/1683501992314798080/xl1POYLw_normal.jpg',
    });
    assert.deepEqual(tweet.entities, {
      hashtags: [
        { text: 'perch', indices: [12, 18] },
        { text: 'v2', indices: [25, 28] },
      ],
      urls: [{ url: 'https://t.co/AbCdEf123', expanded_url: 'https://docs.x.com/x-api/introduction', display_url: 'docs.x.com/x-api/introduc…', indices: [62, 84] }],
      user_mentions: [{ screen_name: 'XDevelopers', id_str: '2244994945', indices: [34, 46] }],
      media: [
        {
          id_str: '1722701582371098624',
          type: 'photo',
          media_url_https: 'https://pbs.twimg.com/media/F-cMHZxWIAAqXyz.jpg',
          url: 'https://t.co/PiCtUrE99',
          expanded_url: 'https://x.com/XDevelopers/status/1722701605825642574/photo/1',
          display_url: 'pic.x.com/PiCtUrE99',
          indices: [85, 107],
        },
      ],
      symbols: [{ text: 'TWTR', indices: [49, 54] }],
    });
    assert.equal(checkResponseBody('tweet', body), undefined);
  });

  it('keeps code-point offsets as they are: after emoji and a non-BMP letter each index still slices its entity', () => {
    const { data } = mapTweet(xFixture('tweet'));
    const text = data.full_text;
    // 🚀, 🐦 and 𝕏 are two UTF-16 units each: UTF-16 offsets would differ from these by 2-3.
    assert.notEqual(text.length, [...text].length);
    assert.equal(slice(text, data.entities.hashtags[0]!.indices), '#perch');
    assert.equal(slice(text, data.entities.hashtags[1]!.indices), '#v2');
    assert.equal(slice(text, data.entities.user_mentions[0]!.indices), '@XDevelopers');
    assert.equal(slice(text, data.entities.symbols[0]!.indices), '$TWTR');
    assert.equal(slice(text, data.entities.urls[0]!.indices), 'https://t.co/AbCdEf123');
    assert.equal(slice(text, data.entities.media[0]!.indices!), 'https://t.co/PiCtUrE99');
  });

  it('refuses a tweet whose author is missing from includes', () => {
    const body = xFixture('tweet');
    body.includes.users = [];
    assert.throws(() => mapTweet(body), { message: '/includes/users has no entry for /data/author_id' });
  });
});

describe('x_v2 mapping: the user timeline', { timeout: 10_000 }, () => {
  it('maps a page to entries of legacy tweets with next_token as cursor_bottom', () => {
    const page = mapTimeline(xFixture('timeline-page1'));
    assert.deepEqual(
      page.data.entries.map((e) => [e.legacy.id_str, e.legacy.created_at, e.legacy.favorite_count, e.legacy.retweet_count]),
      [
        ['1722700000000000003', 'Thu Nov 09 10:00:00 +0000 2023', 30, 3],
        ['1722700000000000002', 'Wed Nov 08 09:30:15 +0000 2023', 20, 2],
        ['1722700000000000001', 'Tue Nov 07 08:00:00 +0000 2023', 10, 1],
      ],
    );
    assert.deepEqual([page.data.cursor_bottom, page.data.has_more], ['7140dibdnow9c7btw3w29grvxfcgvpb9n9coehpk7xz5i', true]);
    const first = page.data.entries[0]!.legacy;
    assert.equal(slice(first.full_text, first.entities.hashtags[0]!.indices), '#coffee');
    assert.deepEqual(page.data.entries[1]!.legacy.entities.media, [
      {
        id_str: '1722700000000000099',
        type: 'video',
        media_url_https: 'https://pbs.twimg.com/ext_tw_video_thumb/1722700000000000099/pu/img/abc.jpg',
        url: 'https://t.co/ViDeO0001',
        expanded_url: 'https://x.com/XDevelopers/status/1722700000000000002/video/1',
        display_url: 'pic.x.com/ViDeO0001',
        indices: [13, 35],
      },
    ]);
    assert.equal(page.data.entries[2]!.legacy.full_text, 'Plain text, no entities &lt;3', 'HTML escapes stay, as in v1.1');
    assert.deepEqual(page.data.entries[2]!.legacy.entities, { hashtags: [], urls: [], user_mentions: [], media: [], symbols: [] });
    assert.ok(!('user' in page.data.entries[0]!.legacy));
    assert.equal(checkResponseBody('tweets', page), undefined);
  });

  it('ends on the page without next_token, and an empty timeline is an empty last page', () => {
    const last = mapTimeline(xFixture('timeline-page2'));
    assert.deepEqual([last.data.entries.length, last.data.cursor_bottom, last.data.has_more], [1, '', false]);
    assert.deepEqual(mapTimeline(xFixture('empty-listing')), { data: { entries: [], cursor_bottom: '', has_more: false } });
    assert.equal(checkResponseBody('tweets', last), undefined);
  });
});

describe('x_v2 mapping: replies', { timeout: 10_000 }, () => {
  it('keeps only the replies of a timeline page and maps each field', () => {
    const page = mapReplies(xFixture('replies-page1'));
    assert.deepEqual(page.meta, { result_count: 2, next_token: '7140dibdnow9c7btw3w29grvxfcgvpb9n9coehpk7xz5j' });
    assert.deepEqual(page.data[0], {
      id: '1722800000000000004',
      text: '@jack thanks 🙏🏼 fixed',
      created_at: 'Fri Nov 10 12:00:00 +0000 2023',
      author: {
        id: '2244994945',
        username: 'XDevelopers',
        name: 'Developers 🛠️',
        profile_image_url: 'https://pbs.twimg.com/profile_images/1683501992314798080/xl1POYLw_normal.jpg',
        verified: true,
      },
      author_id: '2244994945',
      conversation_id: '1722790000000000004',
      in_reply_to_user_id: '12',
      stats: { retweet_count: 1, reply_count: 2, like_count: 7, quote_count: 4, view_count: 504 },
      possibly_sensitive: false,
      lang: 'en',
      source: '',
    });
    assert.deepEqual([page.data[1]!.id, page.data[1]!.in_reply_to_user_id, page.data[1]!.lang, page.data[1]!.possibly_sensitive], ['1722800000000000002', '2244994945', 'und', true]);
    assert.equal(checkResponseBody('replies', page), undefined);
  });

  it('has no next_token on the last page, and view_count 0 where impression_count is absent', () => {
    const page = mapReplies(xFixture('replies-page2'));
    assert.deepEqual(page.meta, { result_count: 1 });
    assert.equal(page.data[0]!.stats.view_count, 0);
    assert.deepEqual(mapReplies(xFixture('empty-listing')), { data: [], meta: { result_count: 0 } });
    assert.equal(checkResponseBody('replies', page), undefined);
  });
});

describe('x_v2 mapping: following', { timeout: 10_000 }, () => {
  it('maps users to result.legacy with following_count as friends_count, and both tokens as cursors', () => {
    const page = mapFollowing(xFixture('following-page1'));
    assert.deepEqual(page.data.users[0], {
      result: {
        legacy: {
          id_str: '783215',
          name: 'X',
          screen_name: 'X',
          description: "what's happening?!",
          followers_count: 1000,
          friends_count: 11,
          verified: true,
          profile_image_url_https: 'https://pbs.twimg.com/profile_images/1/a_normal.jpg',
        },
      },
    });
    assert.deepEqual([page.data.users[1]!.result.legacy.name, page.data.users[1]!.result.legacy.description], ['Zoë 🌍', '']);
    assert.deepEqual([page.data.cursor_bottom, page.data.cursor_top, page.data.has_more], ['DFEDBNRFT3MHCZZZ', '', true]);
    assert.equal(checkResponseBody('following', page), undefined);
  });

  it('ends on the page without next_token; previous_token becomes cursor_top', () => {
    const page = mapFollowing(xFixture('following-page2'));
    assert.deepEqual([page.data.users.length, page.data.users[0]!.result.legacy.description, page.data.cursor_bottom, page.data.cursor_top, page.data.has_more], [1, '', '', 'FFEDBNRFT3MHCAAA', false]);
    assert.equal(checkResponseBody('following', page), undefined);
  });
});

describe('x_v2 mapping: what a 200 says', { timeout: 10_000 }, () => {
  it('reads only-errors "Not Found Error" as not found, on single resources and listings', () => {
    assert.deepEqual(outcomeOf(xFixture('user-not-found'), false), { kind: 'not_found' });
    assert.deepEqual(outcomeOf(xFixture('tweet-not-found'), false), { kind: 'not_found' });
    assert.deepEqual(outcomeOf(xFixture('user-not-found'), true), { kind: 'not_found' });
  });

  it('reads a suspended account (title Forbidden, type resource-not-found) as not found', () => {
    const suspended = {
      errors: [
        {
          value: 'suspended_one',
          detail: 'User has been suspended: [suspended_one].',
          title: 'Forbidden',
          resource_type: 'user',
          parameter: 'username',
          resource_id: 'suspended_one',
          type: 'https://api.twitter.com/2/problems/resource-not-found',
        },
      ],
    };
    assert.deepEqual(outcomeOf(suspended, false), { kind: 'not_found' });
  });

  it('reads a body with neither data nor errors as an empty page, but not as a user', () => {
    assert.deepEqual(outcomeOf(xFixture('empty-listing'), true), { kind: 'data' });
    assert.throws(() => outcomeOf(xFixture('empty-listing'), false), { message: '/data is missing' });
  });

  it('reads a resource the app may not see (a protected account: not-authorized-for-resource) as not found', () => {
    const forbidden = { errors: [{ title: 'Authorization Error', type: 'https://api.twitter.com/2/problems/not-authorized-for-resource', detail: 'secret detail' }] };
    assert.deepEqual(outcomeOf(forbidden, true), { kind: 'not_found' });
    assert.deepEqual(outcomeOf(forbidden, false), { kind: 'not_found' });
  });

  it('names the problem type of other errors, and only a type that is X\'s', () => {
    const invalid = { errors: [{ title: 'Invalid Request', type: 'https://api.twitter.com/2/problems/invalid-request', detail: 'secret detail' }] };
    assert.deepEqual(outcomeOf(invalid, true), { kind: 'errors', type: 'https://api.twitter.com/2/problems/invalid-request' });
    assert.deepEqual(outcomeOf({ errors: [{ title: 'x', type: 'https://evil.example/leak?q=1' }] }, true), { kind: 'errors', type: 'unknown' });
  });
});
