// Upstream bodies in the interface's shapes, deterministic, shared by the v1 upstream and the
// ceiling server so both serve byte-identical pages. Built once as a template around the user id.
// Every field of the interface is present: perch refuses bodies that fail the endpoint's schema.

const UID = '@@UID@@'; // no JSON escaping applies to it, so the template splits cleanly

/** A tweets page (`{"data":{"entries":[{"legacy":{...}}],"cursor_bottom":"...","has_more":true}}`) of about `bytes`. */
function tweetsTemplate(bytes) {
  const entries = [];
  let i = 0;
  const page = () => JSON.stringify({ data: { entries, cursor_bottom: `DAABCgABGaz${'x'.repeat(24)}AAA`, has_more: true } });
  while (page().length < bytes) {
    const id = String(1790000000000000000n + BigInt(i) * 7919n);
    entries.push({
      entryId: `tweet-${id}`,
      legacy: {
        id_str: id,
        user_id_str: UID,
        created_at: `Mon Mar ${String((i % 28) + 1).padStart(2, '0')} 12:${String(i % 60).padStart(2, '0')}:00 +0000 2025`,
        full_text: `Benchmark tweet ${i} \u2014 caching proxies answer repeated reads from memory &amp; spare the provider's quota \ud83d\ude80 #perch`,
        lang: 'en',
        favorite_count: (i * 37) % 1000,
        retweet_count: (i * 13) % 100,
        reply_count: i % 7,
        quote_count: i % 3,
        entities: { hashtags: [{ text: 'perch', indices: [96, 102] }], urls: [], user_mentions: [], media: [] },
      },
    });
    i++;
  }
  return page().split(UID);
}

/** A user object of about `bytes`. */
function userTemplate(bytes) {
  const user = {
    id: UID,
    username: `bench_${UID}`,
    name: 'Bench User',
    profile_image_url: 'https://pbs.example/profile_images/1/bench_normal.jpg',
    profile_banner_url: 'https://pbs.example/profile_banners/1/1500x500',
    created_at: 'Tue Jan 01 00:00:00 +0000 2019',
    followers_count: 1234,
    following_count: 321,
    tweet_count: 4567,
    listed_count: 12,
    verified: false,
    protected: false,
    location: 'Benchmark Lane',
    url: 'https://bench.example',
    pinned_tweet_ids: ['1790000000000000000'],
    description: '',
  };
  const base = JSON.stringify(user).length - 2 * UID.length + 2 * 19;
  user.description = 'lorem ipsum dolor sit amet '.repeat(Math.max(0, Math.ceil((bytes - base) / 27))).slice(0, Math.max(0, bytes - base));
  return JSON.stringify(user).split(UID);
}

export function bodyFactory({ tweetsBytes = 10_240, userBytes = 1_536 } = {}) {
  const tweets = tweetsTemplate(tweetsBytes);
  const user = userTemplate(userBytes);
  return {
    tweets: (userId) => Buffer.from(tweets.join(userId)),
    user: (userId) => Buffer.from(user.join(userId)),
  };
}

/** A following page (`{"data":{"users":[{"result":{"legacy":{...}}}],...}}`) of about `bytes`. */
export function followingPage(bytes = 10_240) {
  const users = [];
  const page = () => JSON.stringify({ data: { users, cursor_bottom: `DAABCgABGaz${'x'.repeat(24)}AAA`, cursor_top: `DAABCgABGaz${'y'.repeat(24)}AAA`, has_more: true } });
  for (let i = 0; page().length < bytes; i++) {
    const id = String(1690000000000000000n + BigInt(i) * 104729n);
    users.push({
      result: {
        rest_id: id,
        legacy: {
          id_str: id,
          name: `Followed Account ${i} \u2728`,
          screen_name: `followed_${i}`,
          description: `Account ${i}: notes on caching, rate limits &amp; quotas.`,
          followers_count: (i * 7919) % 100_000,
          friends_count: (i * 31) % 5_000,
          verified: i % 5 === 0,
          profile_image_url_https: `https://pbs.example/profile_images/${id}/photo_normal.jpg`,
        },
      },
    });
  }
  return Buffer.from(page());
}
