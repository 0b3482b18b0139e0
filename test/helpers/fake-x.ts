import type { IncomingMessage, ServerResponse } from 'node:http';
import type { UpstreamBehaviour } from './upstream-server.js';

const PROBLEMS = 'https://api.twitter.com/2/problems';

/**
 * A stand-in for X's user and tweet lookups, single and batch, answering as X does: a batch is
 * HTTP 200 with `data[]` for the items found and `errors[]` for the rest; a single lookup of an
 * item not there is 200 with only `errors`. Every user and tweet is made from its id, so any id
 * is found unless the test says otherwise.
 */
export interface FakeX {
  readonly behaviour: UpstreamBehaviour;
  /** Ids (or lowercased usernames) X does not have. */
  readonly notFound: Set<string>;
  /** Suspended users: title Forbidden, type resource-not-found. */
  readonly suspended: Set<string>;
  /** Tweets of protected authors: type not-authorized-for-resource. */
  readonly protectedTweets: Set<string>;
  /** Items a batch answer names in neither `data` nor `errors`. */
  readonly omitted: Set<string>;
  /** Items X answers with an error of a type perch does not know. */
  readonly unknownError: Set<string>;
  /** Items X refuses as malformed: any call that lists one is 400 as a whole. */
  readonly malformed: Set<string>;
  /** Answers every call with this status (no body of interest) while set. */
  failWith: { status: number; headers?: Record<string, string> } | undefined;
  /** While true, every batch call of two or more items is 400 (X refusing the form), and single lookups are answered. */
  refusesBatches: boolean;
  /** While true, calls wait in `held` until the test releases them. */
  hold: boolean;
  readonly held: (() => void)[];
  /** For each call perch gave up on before X answered it: how long after it arrived, in ms. */
  readonly abandoned: number[];
}

export function fakeUser(id: string, username = `user_${id}`): Record<string, unknown> {
  return {
    id,
    username,
    name: `User ${id}`,
    created_at: '2013-12-14T04:35:55.000Z',
    description: `about ${id}`,
    pinned_tweet_id: '1722701605825642574',
    public_metrics: { followers_count: Number(id.slice(-4)) || 1, following_count: 2, tweet_count: 3, listed_count: 4 },
    protected: false,
    verified: false,
  };
}

/** The id X gives the user of a username: stable, digits only. */
export function idOfUsername(username: string): string {
  let h = 7;
  for (const c of username.toLowerCase()) h = (h * 31 + c.charCodeAt(0)) % 1_000_000_007;
  return String(h);
}

export function fakeTweet(id: string): Record<string, unknown> {
  return { id, text: `tweet ${id}`, author_id: '42', created_at: '2023-11-09T19:45:02.000Z', public_metrics: { retweet_count: 1, reply_count: 2, like_count: 3, quote_count: 4 } };
}

const AUTHOR = { id: '42', name: 'Author', username: 'author', profile_image_url: 'https://pbs.twimg.com/a.jpg' };

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': status === 200 ? 'application/json' : 'application/problem+json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

export function fakeX(): FakeX {
  const x: FakeX = {
    notFound: new Set(),
    suspended: new Set(),
    protectedTweets: new Set(),
    omitted: new Set(),
    unknownError: new Set(),
    malformed: new Set(),
    failWith: undefined,
    refusesBatches: false,
    hold: false,
    held: [],
    abandoned: [],
    behaviour: (req, res) => {
      const arrived = performance.now();
      res.on('close', () => {
        if (!res.writableEnded) x.abandoned.push(performance.now() - arrived);
      });
      if (x.hold) x.held.push(() => answer(req, res));
      else answer(req, res);
    },
  };

  function problem(kind: 'user' | 'tweet', parameter: string, item: string): Record<string, unknown> {
    const base = { value: item, resource_type: kind, parameter, resource_id: item };
    if (x.unknownError.has(item)) return { ...base, title: 'Something Else', detail: 'Something else went wrong.', type: `${PROBLEMS}/something-else` };
    if (x.suspended.has(item)) return { ...base, title: 'Forbidden', detail: `User has been suspended: [${item}].`, type: `${PROBLEMS}/resource-not-found` };
    if (x.protectedTweets.has(item)) return { ...base, title: 'Authorization Error', detail: `Sorry, you are not authorized to see the Tweet with id: [${item}].`, type: `${PROBLEMS}/not-authorized-for-resource` };
    return { ...base, title: 'Not Found Error', detail: `Could not find ${kind} with ${parameter}: [${item}].`, type: `${PROBLEMS}/resource-not-found` };
  }

  const gone = (item: string) => x.notFound.has(item) || x.suspended.has(item) || x.protectedTweets.has(item) || x.unknownError.has(item);

  function answer(req: IncomingMessage, res: ServerResponse): void {
    if (x.failWith !== undefined) return send(res, x.failWith.status, { title: 'failure' }, x.failWith.headers);
    const url = new URL(req.url ?? '/', 'http://x');
    const path = url.pathname;
    const single = /^\/2\/(users|tweets)\/([0-9]+)$/.exec(path) ?? /^\/2\/users\/by\/username\/([A-Za-z0-9_]+)$/.exec(path);
    if (single !== null) {
      const byName = path.startsWith('/2/users/by/username/');
      const kind = byName || single[1] === 'users' ? 'user' : 'tweet';
      const asked = byName ? single[1]! : single[2]!;
      const item = byName ? asked.toLowerCase() : asked;
      if (x.malformed.has(item)) return send(res, 400, { title: 'Invalid Request' });
      if (gone(item)) return send(res, 200, { errors: [problem(kind, byName ? 'username' : 'id', asked)] });
      if (kind === 'tweet') return send(res, 200, { data: fakeTweet(item), includes: { users: [AUTHOR] } });
      return send(res, 200, { data: byName ? fakeUser(idOfUsername(asked), asked.toUpperCase()) : fakeUser(item) });
    }
    const parameter = path === '/2/users/by' ? 'usernames' : 'ids';
    const list = url.searchParams.get(parameter);
    if ((path !== '/2/users' && path !== '/2/users/by' && path !== '/2/tweets') || list === null) return send(res, 404, { title: 'Not Found' });
    const asked = list.split(',');
    if (asked.length > 100 || asked.some((a) => x.malformed.has(a.toLowerCase())) || (x.refusesBatches && asked.length > 1)) return send(res, 400, { title: 'Invalid Request' });
    const kind = path === '/2/tweets' ? 'tweet' : 'user';
    const data: unknown[] = [];
    const errors: unknown[] = [];
    for (const a of asked) {
      const item = parameter === 'usernames' ? a.toLowerCase() : a;
      if (x.omitted.has(item)) continue;
      if (gone(item)) errors.push(problem(kind, parameter, a));
      // X answers with the username as its user spelled it (here: upper case), whatever case was asked.
      else data.push(kind === 'tweet' ? fakeTweet(a) : parameter === 'usernames' ? fakeUser(idOfUsername(a), a.toUpperCase()) : fakeUser(a));
    }
    // An expansion's problem (the pinned tweet of the first user) concerns no item asked for.
    if (kind === 'user' && data.length > 0) errors.push({ value: '1722701605825642574', detail: 'Could not find tweet', title: 'Not Found Error', resource_type: 'tweet', parameter: 'pinned_tweet_id', resource_id: '1722701605825642574', type: `${PROBLEMS}/resource-not-found`, section: 'includes' });
    send(res, 200, { ...(data.length > 0 ? { data } : {}), ...(kind === 'tweet' && data.length > 0 ? { includes: { users: [AUTHOR] } } : {}), ...(errors.length > 0 ? { errors } : {}) });
  }

  return x;
}
