import assert from 'node:assert/strict';
import { once } from 'node:events';
import { connect } from 'node:net';
import { test } from 'node:test';
import { onCleanup } from './helpers/cleanup.js';
import { KEY, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { parseResponses, rawGet } from './helpers/raw-http.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

/**
 * The invariant the slabs rest on (cache/grace-periods.ts): bytes handed to a response are not
 * reused while it is open. Hits pipelined behind a miss whose upstream holds its answer are
 * queued in node:http with views of their entries; the entries are then evicted many times over,
 * and the answers must still arrive whole.
 */
test('answers queued behind a slow one keep their bytes while eviction reuses every region', { timeout: 60_000 }, async (t) => {
  let release: (() => void) | undefined;
  const slowUpstream = await startUpstream(t, (req, res) => {
    release = () => sampleProvider(req, res);
  });
  // 1 MiB holds about seventy 10 KB pages with their variants. Users come from the slow upstream.
  const perch = await startPerch(
    t,
    testConfig(`demo: { kind: fixture }\n${v1('slow', slowUpstream.url, 'timeout_ms: 30000')}`, 'routes: { user: [slow] }\ncache: { memory: { max_bytes: 1048576 } }'),
  );
  const { grace } = perch.cache.memory;
  const get = async (path: string) => {
    const res = await fetch(`${perch.url}${path}`, { headers: { 'x-api-key': KEY, 'accept-encoding': 'identity' } });
    assert.equal(res.status, 200);
    return Buffer.from(await res.arrayBuffer()).toString('latin1');
  };
  const pages = Array.from({ length: 20 }, (_, i) => `/v1/users/${100 + i}/tweets`);
  const expected = new Map<string, string>();
  for (const path of pages) expected.set(path, await get(path));
  await perch.cache.settled();

  const order = ['/v1/users/1', ...pages, ...pages];
  const client = connect({ port: Number(new URL(perch.url).port), host: '127.0.0.1' });
  onCleanup(t, () => client.destroy());
  await once(client, 'connect');
  const chunks: Buffer[] = [];
  client.on('data', (chunk: Buffer) => chunks.push(chunk));
  client.write(order.map((path) => rawGet(path, KEY)).join(''));
  // The user waits on its upstream; the pages behind it are answered from memory at once and
  // queued until it is sent (node:http stops parsing once 16 KB are queued: a few pages).
  await waitFor(() => release !== undefined && grace.open >= 3);

  // Fifty distinct pages a round, four rounds: several times what the tier holds.
  for (let round = 0; round < 4; round++) {
    await Promise.all(Array.from({ length: 50 }, (_, i) => get(`/v1/users/${1000 + round * 50 + i}/tweets`)));
  }
  await perch.cache.settled();

  release!();
  await waitFor(() => parseResponses(Buffer.concat(chunks).toString('latin1')).length === order.length, 30_000);
  const answers = parseResponses(Buffer.concat(chunks).toString('latin1'));
  for (const [i, answer] of answers.entries()) {
    assert.equal(answer.status, 200);
    if (i === 0) continue;
    assert.ok(answer.body === expected.get(order[i]!), `answer ${i} (${order[i]}) is not its own page: ${answer.body.slice(0, 80)}`);
  }
});
