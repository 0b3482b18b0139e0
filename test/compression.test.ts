import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { test } from 'node:test';
import { createHash } from 'node:crypto';
import { promisify } from 'node:util';
import { brotliDecompressSync, gunzipSync } from 'node:zlib';
import { request, fetch as undiciFetch } from 'undici';
import { ManualClock } from './helpers/clock.js';
import { KEY, metric, startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { sampleTweetsPage } from './helpers/sample-bodies.js';
import { ADMIN_YAML, purge } from './helpers/admin.js';
import { json, startUpstream } from './helpers/upstream-server.js';

const T = { timeout: 20_000 };
const PAGE = '/v1/users/12/tweets';
const run = promisify(execFile);

/** perch on the fixture upstream, whose tweets pages are several KB; `extra` is more YAML. */
async function perchWithFixture(t: Parameters<typeof startPerch>[0], extra = '', plan = ''): Promise<RunningPerch> {
  const yaml = testConfig('demo: { kind: fixture }', extra);
  return startPerch(t, plan === '' ? yaml : yaml.replace('big: { capacity: 100000, refill_per_second: 100000 }', plan));
}

/** The raw bytes of a response, undecoded: node's fetch would inflate them for us. */
async function raw(perch: RunningPerch, path: string, headers: Record<string, string> = {}, method = 'GET') {
  const res = await request(perch.url + path, { method: method as 'GET', headers: { 'x-api-key': KEY, ...headers } });
  const body = Buffer.from(await res.body.arrayBuffer());
  await perch.cache.settled();
  return { status: res.statusCode, headers: res.headers as Record<string, string | undefined>, body };
}

test('a miss answers identity and stores br and gzip; hits send the coding the client takes best, each decoding to the identity bytes', T, async (t) => {
  const perch = await perchWithFixture(t);
  const miss = await raw(perch, PAGE, { 'accept-encoding': 'br, gzip' });
  assert.equal(miss.status, 200);
  assert.equal(miss.headers['content-encoding'], undefined, 'the first answer goes out before the variants exist');
  assert.equal(miss.headers['vary'], 'X-API-Key, Accept-Encoding');
  const identity = miss.body;
  assert.ok(identity.length > 1024, `the fixture page is ${identity.length} bytes, above min_bytes`);

  const br = await raw(perch, PAGE, { 'accept-encoding': 'gzip, deflate, br' });
  assert.equal(br.headers['content-encoding'], 'br');
  assert.equal(br.headers['vary'], 'X-API-Key, Accept-Encoding');
  assert.equal(Number(br.headers['content-length']), br.body.length);
  assert.ok(brotliDecompressSync(br.body).equals(identity));
  assert.ok(br.body.length < identity.length * 0.5, `br ${br.body.length} of ${identity.length}`);

  const gz = await raw(perch, PAGE, { 'accept-encoding': 'gzip' });
  assert.equal(gz.headers['content-encoding'], 'gzip');
  assert.ok(gunzipSync(gz.body).equals(identity));

  const plain = await raw(perch, PAGE);
  assert.equal(plain.headers['content-encoding'], undefined);
  assert.ok(plain.body.equals(identity));
  assert.equal(plain.headers['cache-status']?.startsWith('perch; hit'), true);

  // undici's fetch negotiates and inflates on its own; so does curl --compressed.
  for (const coding of ['br', 'gzip']) {
    const fetched = await undiciFetch(perch.url + PAGE, { headers: { 'x-api-key': KEY, 'accept-encoding': coding } });
    assert.equal(fetched.headers.get('content-encoding'), coding);
    assert.ok(Buffer.from(await fetched.arrayBuffer()).equals(identity), `undici's fetch inflates ${coding}`);
  }
  for (const flags of [['--compressed'], ['--compressed', '-H', 'Accept-Encoding: gzip']]) {
    const { stdout } = await run('curl', ['-sS', ...flags, '-H', `X-API-Key: ${KEY}`, perch.url + PAGE], { encoding: 'buffer', maxBuffer: 1 << 20 });
    assert.ok(stdout.equals(identity), `curl ${flags.join(' ')}`);
  }
});

test('HEAD of a compressed hit has the variant\'s Content-Length and Content-Encoding, and no body', T, async (t) => {
  const perch = await perchWithFixture(t);
  await raw(perch, PAGE);
  const gz = await raw(perch, PAGE, { 'accept-encoding': 'gzip' });
  const head = await raw(perch, PAGE, { 'accept-encoding': 'gzip' }, 'HEAD');
  assert.equal(head.status, 200);
  assert.equal(head.headers['content-encoding'], 'gzip');
  assert.equal(Number(head.headers['content-length']), gz.body.length);
  assert.equal(head.headers['etag'], gz.headers['etag']);
  assert.equal(head.body.length, 0);
});

test('each coding has its own strong tag, the same for every request; Last-Modified is when the upstream answered', T, async (t) => {
  const clock = new ManualClock();
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'), { clock, timers: clock });
  const answeredAt = clock.now();
  const miss = await raw(perch, PAGE);
  const tag = miss.headers['etag']!;
  assert.match(tag, /^"[A-Za-z0-9_-]{22}"$/);
  assert.equal(tag, `"${createHash('sha256').update(miss.body).digest('base64url').slice(0, 22)}"`);
  assert.equal(miss.headers['last-modified'], new Date(answeredAt).toUTCString());
  clock.advance(5_000);
  const hit = await raw(perch, PAGE);
  assert.equal(hit.headers['etag'], tag);
  assert.equal(hit.headers['last-modified'], new Date(answeredAt).toUTCString());
  assert.equal((await raw(perch, PAGE, { 'accept-encoding': 'br' })).headers['etag'], `${tag.slice(0, -1)}-br"`);
  assert.equal((await raw(perch, PAGE, { 'accept-encoding': 'gzip' })).headers['etag'], `${tag.slice(0, -1)}-gzip"`);
});

test('If-None-Match with the representation\'s tag is 304: no body, the cache, rate-limit and Vary headers, and the revalidated outcome', T, async (t) => {
  const perch = await perchWithFixture(t, '', 'big: { capacity: 100, refill_per_second: 0.001, cost_of_hit: 1 }');
  const first = await raw(perch, PAGE, { 'accept-encoding': 'gzip' });
  const gzTag = (await raw(perch, PAGE, { 'accept-encoding': 'gzip' })).headers['etag']!;
  const notModified = await raw(perch, PAGE, { 'accept-encoding': 'gzip', 'if-none-match': gzTag });
  assert.equal(notModified.status, 304);
  assert.equal(notModified.body.length, 0);
  assert.equal(notModified.headers['etag'], gzTag);
  assert.equal(notModified.headers['vary'], 'X-API-Key, Accept-Encoding');
  assert.match(notModified.headers['cache-control'] ?? '', /^private, max-age=\d+$/);
  assert.match(notModified.headers['cache-status'] ?? '', /^perch; hit; ttl=\d+$/);
  assert.equal(notModified.headers['last-modified'], first.headers['last-modified']);
  assert.equal(notModified.headers['content-encoding'], undefined);
  assert.equal(notModified.headers['content-length'], undefined);
  // A 304 is a hit for the bucket: miss, hit, 304 cost one token each (cost_of_hit: 1).
  assert.match(notModified.headers['ratelimit'] ?? '', /^"big";r=97;t=\d+$/);
  const line = perch.logs.lines().filter((l) => l.msg === 'request').at(-1);
  assert.equal(line?.cache, 'revalidated');
  assert.equal(line?.status, 304);
  assert.equal(await metric(perch, 'perch_requests_total{route="tweets",status="304",cache="revalidated"}'), 1);
  assert.equal(await metric(perch, 'perch_key_upstream_calls_saved_total{key_id="alpha",reason="revalidated"}'), 1);

  // The tag of another coding is another representation: the full answer.
  assert.equal((await raw(perch, PAGE, { 'if-none-match': gzTag })).status, 200);
  // Weak comparison, lists, and tags with commas in them.
  const identityTag = first.headers['etag']!;
  for (const header of [`W/${identityTag}`, `"x,y", ${identityTag}`, `"a" ,W/"b",${identityTag}`, '*']) {
    assert.equal((await raw(perch, PAGE, { 'if-none-match': header })).status, 304, header);
  }
  for (const header of ['"nope"', identityTag.slice(1, -1), `"${identityTag}"`]) {
    assert.equal((await raw(perch, PAGE, { 'if-none-match': header })).status, 200, header);
  }
  const head = await raw(perch, PAGE, { 'if-none-match': identityTag }, 'HEAD');
  assert.deepEqual([head.status, head.body.length], [304, 0]);
});

test('If-Modified-Since is 304 when the entry is no newer, and counts only without If-None-Match; a bad date is ignored', T, async (t) => {
  const perch = await perchWithFixture(t);
  const miss = await raw(perch, PAGE);
  const lastModified = miss.headers['last-modified']!;
  const later = new Date(Date.parse(lastModified) + 1000).toUTCString();
  const earlier = new Date(Date.parse(lastModified) - 1000).toUTCString();
  assert.equal((await raw(perch, PAGE, { 'if-modified-since': lastModified })).status, 304);
  assert.equal((await raw(perch, PAGE, { 'if-modified-since': later })).status, 304);
  assert.equal((await raw(perch, PAGE, { 'if-modified-since': earlier })).status, 200);
  assert.equal((await raw(perch, PAGE, { 'if-modified-since': 'yesterday-ish' })).status, 200);
  // Not HTTP-dates, though Date.parse reads each as a year to come.
  for (const header of ['3000', '2027', 'x 2030', '2030-01-01T00:00:00Z', 'Mon, 01 Jan 2099 00:00:00 GMT', 'Thu, 31 Feb 2030 00:00:00 GMT', 'Tue, 01 Jan 2030 00:00:00 UTC']) {
    assert.equal((await raw(perch, PAGE, { 'if-modified-since': header })).status, 200, header);
  }
  // The two obsolete forms RFC 9110 makes recipients accept.
  assert.equal((await raw(perch, PAGE, { 'if-modified-since': 'Tuesday, 01-Jan-30 00:00:00 GMT' })).status, 304);
  assert.equal((await raw(perch, PAGE, { 'if-modified-since': 'Tue Jan  1 00:00:00 2030' })).status, 304);
  // If-None-Match decides when both are sent (RFC 9110 13.2.2).
  assert.equal((await raw(perch, PAGE, { 'if-modified-since': later, 'if-none-match': '"other"' })).status, 200);
  assert.equal((await raw(perch, PAGE, { 'if-modified-since': earlier, 'if-none-match': miss.headers['etag']! })).status, 304);
});

test('a body under min_bytes, a 404 and an error are sent as they are, without tags on errors', T, async (t) => {
  const perch = await perchWithFixture(t, 'cache: { compression: { min_bytes: 1000000 } }');
  await raw(perch, PAGE);
  const hit = await raw(perch, PAGE, { 'accept-encoding': 'br, gzip' });
  assert.equal(hit.headers['content-encoding'], undefined);
  assert.equal(hit.headers['vary'], 'X-API-Key, Accept-Encoding');
  const notFound = await raw(perch, '/v1/users/4040000000000000000', { 'accept-encoding': 'gzip' });
  assert.equal(notFound.status, 404);
  assert.deepEqual([notFound.headers['content-encoding'], notFound.headers['etag'], notFound.headers['last-modified']], [undefined, undefined, undefined]);
  // A validator cannot turn a 404 into a 304 (RFC 9110 13.2.1: only a 2xx answer is conditional).
  assert.equal((await raw(perch, '/v1/users/4040000000000000000', { 'if-none-match': '*' })).status, 404);
  const bad = await raw(perch, '/v1/users/abc', { 'accept-encoding': 'gzip', 'if-none-match': '*' });
  assert.equal(bad.status, 400);
  assert.equal(bad.headers['content-encoding'], undefined);
});

test('with brotli and gzip off, nothing is compressed and answers vary on the key alone', T, async (t) => {
  const perch = await perchWithFixture(t, 'cache: { compression: { brotli: false, gzip: false } }');
  await raw(perch, PAGE);
  const hit = await raw(perch, PAGE, { 'accept-encoding': 'br, gzip' });
  assert.equal(hit.headers['content-encoding'], undefined);
  assert.equal(hit.headers['vary'], 'X-API-Key');
  assert.ok(hit.headers['etag'] !== undefined, 'validators do not depend on compression');
});

test('with gzip only, a br client gets gzip when it takes it and identity when it does not', T, async (t) => {
  const perch = await perchWithFixture(t, 'cache: { compression: { brotli: false } }');
  await raw(perch, PAGE);
  assert.equal((await raw(perch, PAGE, { 'accept-encoding': 'br, gzip;q=0.5' })).headers['content-encoding'], 'gzip');
  assert.equal((await raw(perch, PAGE, { 'accept-encoding': 'br' })).headers['content-encoding'], undefined);
});

test('a stale entry served while it refreshes keeps its coding and validators; its 304 is counted as stale', T, async (t) => {
  const clock = new ManualClock();
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', 'cache: { ttl_seconds: { tweets: 10 } }'), { clock, timers: clock });
  await raw(perch, PAGE);
  const hit = await raw(perch, PAGE, { 'accept-encoding': 'gzip' });
  clock.advance(11_000);
  const stale = await raw(perch, PAGE, { 'accept-encoding': 'gzip', 'if-none-match': hit.headers['etag']! });
  assert.equal(stale.status, 304);
  assert.match(stale.headers['cache-status'] ?? '', /^perch; fwd=stale/);
  assert.equal(perch.logs.lines().filter((l) => l.msg === 'request').at(-1)?.cache, 'stale');
});

test('a refresh that returns the same bytes keeps Last-Modified, and If-Modified-Since with it is still 304; new bytes date from their refresh', T, async (t) => {
  const clock = new ManualClock();
  clock.advance(250);
  const page = sampleTweetsPage();
  const upstream = await startUpstream(t, json(200, page));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), 'cache: { ttl_seconds: { tweets: 10 } }'), { clock, timers: clock });
  const PATH = '/v1/users/1/tweets';
  const first = await raw(perch, PATH);
  const lastModified = first.headers['last-modified']!;
  assert.equal(lastModified, new Date(clock.now()).toUTCString());
  /** A stale answer starts the refresh; done once the entry is a fresh hit again. */
  const refreshed = async () => {
    clock.advance(11_000);
    assert.match((await raw(perch, PATH)).headers['cache-status'] ?? '', /^perch; fwd=stale/);
    await waitFor(async () => ((await raw(perch, PATH)).headers['cache-status'] ?? '').startsWith('perch; hit'));
    return raw(perch, PATH);
  };
  const same = await refreshed();
  assert.equal(upstream.requests.length, 2);
  assert.deepEqual([same.headers['age'], same.headers['etag'], same.headers['last-modified']], ['0', first.headers['etag'], lastModified]);
  assert.equal((await raw(perch, PATH, { 'if-modified-since': lastModified })).status, 304);

  upstream.behaviour = json(200, { ...page, data: { ...page.data, cursor_bottom: 'c' } });
  const changed = await refreshed();
  assert.notEqual(changed.headers['etag'], first.headers['etag']);
  assert.equal(changed.headers['last-modified'], new Date(clock.now()).toUTCString());
  assert.equal((await raw(perch, PATH, { 'if-modified-since': lastModified })).status, 200);
});

test('new bytes fetched after a purge within the second of the old ones go out undated: If-Modified-Since is 200, not 304', T, async (t) => {
  const clock = new ManualClock();
  clock.advance(100);
  const page = sampleTweetsPage();
  const upstream = await startUpstream(t, json(200, page));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), ADMIN_YAML), { clock, timers: clock });
  const PATH = '/v1/users/1/tweets';
  const old = await raw(perch, PATH);
  upstream.behaviour = json(200, { ...page, data: { ...page.data, cursor_bottom: 'c' } });
  assert.equal((await purge(perch, { all: true })).status, 200);
  clock.advance(500);
  const fresh = await raw(perch, PATH);
  assert.notEqual(fresh.headers['etag'], old.headers['etag']);
  // A date of that second would name both bodies: the new one goes out undated, its tag alone.
  assert.ok(old.headers['last-modified'] !== undefined);
  assert.equal(fresh.headers['last-modified'], undefined);
  assert.equal((await raw(perch, PATH, { 'if-modified-since': old.headers['last-modified']! })).status, 200);
  assert.equal((await raw(perch, PATH, { 'if-none-match': fresh.headers['etag']! })).status, 304);
  clock.advance(1000);
  assert.equal((await raw(perch, PATH, { 'if-modified-since': new Date(clock.now()).toUTCString() })).status, 200, 'no date was sent with it: none matches');
});
