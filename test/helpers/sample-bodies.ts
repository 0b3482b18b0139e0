/**
 * Complete provider bodies of each endpoint, with every field the interface specification lists,
 * so they pass perch's response check. Tests that need a particular user or one broken field
 * start from these and change only that.
 */

const CREATED_AT = 'Wed Oct 10 20:19:24 +0000 2018';
// A function, not a constant: tests change bodies in place, and must not change each other's.
function entities() {
  return {
    hashtags: [{ text: 'perch', indices: [6, 12] }],
    urls: [{ url: 'https://t.co/abc', expanded_url: 'https://example.com/a', display_url: 'example.com/a', indices: [13, 36] }],
    user_mentions: [],
    media: [],
  };
}

/** A user (GET /v1/users/{id} and /by/username/{username}). */
export function sampleUser(id = '123', username = 'Alice') {
  return {
    id,
    username,
    name: username,
    description: 'Reads a lot.',
    profile_image_url: 'https://img.example/p.jpg',
    profile_banner_url: 'https://img.example/b.jpg',
    followers_count: 10,
    following_count: 20,
    tweet_count: 30,
    listed_count: 1,
    verified: false,
    created_at: CREATED_AT,
    location: 'Lisbon',
    url: 'https://example.com',
    protected: false,
    pinned_tweet_ids: ['456'],
  };
}

function legacyTweet(id: string) {
  return {
    created_at: CREATED_AT,
    id_str: id,
    full_text: 'hello #perch https://t.co/abc',
    favorite_count: 3,
    retweet_count: 2,
    reply_count: 1,
    quote_count: 0,
    entities: entities(),
  };
}

/** A single tweet (GET /v1/tweets/{id}). */
export function sampleTweet(id = '456') {
  return {
    data: {
      ...legacyTweet(id),
      user: { id_str: '123', name: 'Alice', screen_name: 'Alice', profile_image_url_https: 'https://img.example/p.jpg' },
    },
  };
}

/** A tweets page of two entries (GET /v1/users/{id}/tweets). */
export function sampleTweetsPage() {
  return { data: { entries: [{ legacy: legacyTweet('456') }, { legacy: legacyTweet('457') }], cursor_bottom: 'b', has_more: false } };
}

function reply(id: string) {
  return {
    id,
    text: '@Bob indeed',
    created_at: CREATED_AT,
    author: { id: '123', username: 'Alice', name: 'Alice', profile_image_url: 'https://img.example/p.jpg', verified: false },
    author_id: '123',
    conversation_id: '400',
    in_reply_to_user_id: '124',
    stats: { retweet_count: 0, reply_count: 1, like_count: 5, quote_count: 0, view_count: 90 },
    possibly_sensitive: false,
    lang: 'en',
    source: 'Perch Web',
  };
}

/** A replies page of two replies, the last page (no `next_token`) (GET /v1/users/{id}/replies). */
export function sampleRepliesPage() {
  return { data: [reply('501'), reply('502')], meta: { result_count: 2 } };
}

function followed(id: string, name: string) {
  return {
    result: {
      legacy: {
        id_str: id,
        name,
        screen_name: name,
        description: 'Writes a lot.',
        followers_count: 7,
        friends_count: 8,
        verified: true,
        profile_image_url_https: 'https://img.example/f.jpg',
      },
    },
  };
}

/** A following page of two users (GET /v1/users/{id}/following). */
export function sampleFollowingPage() {
  return { data: { users: [followed('124', 'Bob'), followed('125', 'Carol')], cursor_bottom: 'b', cursor_top: 't', has_more: false } };
}

/** One complete body per response shape, for upstreams that answer successfully. */
export const SAMPLE_BODIES = {
  user: sampleUser(),
  tweet: sampleTweet(),
  tweets: sampleTweetsPage(),
  replies: sampleRepliesPage(),
  following: sampleFollowingPage(),
} as const;
