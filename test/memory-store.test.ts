import assert from 'node:assert/strict';
import { test } from 'node:test';
import { newEntry, type CacheEntry } from '../src/cache/entry.js';
import { MemoryStore } from '../src/cache/memory-store.js';
import { ManualClock } from './helpers/clock.js';
import { KEY, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { holdConnection, rawGet } from './helpers/raw-http.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

const T = { timeout: 10_000 };

function page(fill: number, bytes = 10_000): CacheEntry {
  return newEntry({ status: 200, body: Buffer.alloc(bytes, fill), storedAt: 0, ttlMs: 60_000, generation: { all: 0, scope: 0 } });
}

test('bytes an open request read stay intact after their entry is evicted, and their region is reused once it closes', T, () => {
  // Room for five 10 KB pages: each store after the fifth evicts the oldest.
  const store = new MemoryStore({ maxBytes: 60_000, clock: new ManualClock() });
  for (let i = 0; i < 5; i++) store.set(`/p/${i}`, page(i), 60_000);
  const reading = store.grace.enter();
  const read = store.get('/p/0')!;
  for (let i = 5; i < 40; i++) store.set(`/p/${i}`, page(i), 60_000);
  assert.equal(store.get('/p/0'), undefined, 'evicted');
  assert.ok(read.body.every((b) => b === 0), 'another page was written over what the request is sending');
  store.grace.leave(reading);
  for (let i = 40; i < 80; i++) store.set(`/p/${i}`, page(i), 60_000);
  for (let i = 75; i < 80; i++) assert.ok(store.get(`/p/${i}`)!.body.every((b) => b === i), `page ${i}`);
  assert.ok(read.body.some((b) => b !== 0), 'after the request closed, its region went to a later page');
});

test('holds: the entry under a key is the response given, though the tier keeps a copy', T, () => {
  const store = new MemoryStore({ maxBytes: 60_000, clock: new ManualClock() });
  const given = page(1);
  store.set('/p', given, 60_000);
  assert.notEqual(store.get('/p'), given);
  assert.equal(store.holds('/p', given), true);
  assert.equal(store.holds('/p', { ...given, storedAt: 1 }), false);
  assert.equal(store.holds('/other', given), false);
});

test('entries of one generation share one generation object; a new generation gets its own, values kept', T, () => {
  // Each entry keeping an object of its own cost 48 bytes of heap per entry (issue 22).
  const store = new MemoryStore({ maxBytes: 600_000, clock: new ManualClock() });
  const stamped = (fill: number, all: number, scope: number) => newEntry({ ...page(fill, 2_000), generation: { all, scope } });
  store.set('/a', stamped(1, 3, 1), 60_000);
  store.set('/b', stamped(2, 3, 1), 60_000);
  store.set('/c', stamped(3, 3, 2), 60_000);
  store.set('/d', stamped(4, 4, 0), 60_000);
  store.set('/e', stamped(5, 4, 0), 60_000);
  const [a, b, c, d, e] = ['/a', '/b', '/c', '/d', '/e'].map((key) => store.get(key)!.generation);
  assert.equal(a, b);
  assert.deepEqual([a, c, d], [{ all: 3, scope: 1 }, { all: 3, scope: 2 }, { all: 4, scope: 0 }]);
  assert.notEqual(c, a);
  assert.equal(d, e);
});

test('an entry its charge keeps out of the tier gives its region back at once', T, () => {
  // The pool reserves max_bytes; a 10,240-byte region fits once, its entry's charge does not.
  const store = new MemoryStore({ maxBytes: 11_000, clock: new ManualClock() });
  store.set(`/${'x'.repeat(100)}`, page(1, 10_240), 60_000);
  assert.deepEqual(store.size(), { entries: 0, bytes: 0 });
  store.set('/k', page(2), 60_000);
  const kept = store.get('/k')!;
  assert.equal(kept.body.buffer.byteLength, 11_000, 'kept in the pool, in the region the refused entry gave back');
  assert.equal(kept.body.byteOffset, 0);
});

test('every API request holds the memory tier\'s regions from its arrival until its response closes', T, async (t) => {
  let answer: (() => void) | undefined;
  const upstream = await startUpstream(t, (req, res) => {
    answer = () => sampleProvider(req, res);
  });
  const perch = await startPerch(t, testConfig(v1('slow', upstream.url)));
  const { grace } = perch.cache.memory;
  assert.equal(grace.open, 0);
  const pending = perch.request('/v1/users/1');
  await waitFor(() => answer !== undefined);
  assert.equal(grace.open, 1, 'a miss waiting on its upstream is open');
  answer!();
  assert.equal((await pending).status, 200);
  await waitFor(() => grace.open === 0);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  await waitFor(() => grace.open === 0);
  assert.equal((await perch.request('/nope')).status, 404);
  await waitFor(() => grace.open === 0);
});

test('pipelined requests still queued when their client goes leave too', T, async (t) => {
  const held: Array<() => void> = [];
  const upstream = await startUpstream(t, (req, res) => {
    held.push(() => sampleProvider(req, res));
  });
  const perch = await startPerch(t, testConfig(v1('slow', upstream.url)));
  const { grace } = perch.cache.memory;
  const client = await holdConnection(t, Number(new URL(perch.url).port));
  client.socket.write(['/v1/users/1', '/v1/users/2', '/v1/users/3'].map((path) => rawGet(path, KEY)).join(''));
  await waitFor(() => grace.open === 3);
  client.socket.destroy();
  await waitFor(() => grace.open === 0);
  for (const answer of held) answer();
});

test('after the traffic mix changes, the bodies hold the regions cut plus the entries outside the pool: within 2x max_bytes, as stated', { timeout: 60_000 }, () => {
  // Issue 50's fills: 200k entries of 300 B, then 4k of 30 KB, into 64 MiB.
  const maxBytes = 64 * 1024 * 1024;
  const store = new MemoryStore({ maxBytes, clock: new ManualClock() });
  const small = Buffer.alloc(300, 1);
  const large = Buffer.alloc(30_000, 2);
  const fill = (prefix: string, count: number, body: Buffer) => {
    for (let i = 0; i < count; i++) store.set(`/${prefix}/${i}`, newEntry({ status: 200, body, storedAt: 0, ttlMs: 60_000, generation: { all: 0, scope: 0 } }), 60_000);
  };
  fill('small', 200_000, small);
  const mixOne = store.slabs;
  // Every entry in a 320-byte region, nothing outside the pool; while the mix holds, regions are
  // reused at once (no request open), and only the few left when longer keys let fewer entries
  // fit are idle.
  assert.equal(mixOne.ownBytes, 0);
  assert.equal(mixOne.inUseBytes, store.size().entries * 320);
  assert.equal((mixOne.cutBytes - mixOne.inUseBytes) / 320, 162);
  fill('large', 4000, large);
  const mixTwo = store.slabs;
  const { entries, bytes: charged } = store.size();
  assert.ok(charged <= maxBytes);
  // The small regions stay cut and idle; the large entries fill the rest of the reservation
  // (30,720-byte regions), then take memory of their own.
  assert.equal(mixTwo.cutBytes - mixTwo.inUseBytes, mixOne.cutBytes);
  const inRegions = mixTwo.inUseBytes / 30_720;
  assert.equal(mixTwo.ownBytes, (entries - inRegions) * 30_000);
  assert.equal(mixTwo.cutBytes, mixOne.cutBytes + mixTwo.inUseBytes);
  assert.ok(mixTwo.cutBytes <= maxBytes);
  const held = mixTwo.cutBytes + mixTwo.ownBytes;
  assert.ok(held <= 2 * maxBytes, `${held} bytes held`);
  // The figures of the issue: about 22 MB idle, about 1.3x max_bytes held.
  assert.deepEqual([Math.round(mixOne.cutBytes / 1e6), Math.round((held / maxBytes) * 10) / 10], [22, 1.3]);
});
