// Upstream bodies in the interface's shapes, deterministic, shared by the v1 upstream and the
// ceiling server so both serve byte-identical pages. Built once as a template around the user id.

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
        entities: { hashtags: [{ text: 'perch', indices: [96, 102] }], urls: [], user_mentions: [] },
      },
    });
    i++;
  }
  return page().split(UID);
}

/** A user object of about `bytes` (the user endpoint needs string `id` and `username`). */
function userTemplate(bytes) {
  const user = {
    id: UID,
    username: `bench_${UID}`,
    name: 'Bench User',
    created_at: 'Tue Jan 01 00:00:00 +0000 2019',
    followers_count: 1234,
    following_count: 321,
    verified: false,
    location: 'Benchmark Lane',
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
