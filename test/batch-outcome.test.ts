import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { EndpointRequest } from '../src/endpoints.js';
import { batchOutcomes } from '../src/upstream/x-v2/batch-outcome.js';
import { MappingError } from '../src/upstream/x-v2/read.js';

const P = 'https://api.twitter.com/2/problems';
const user = (id: string): EndpointRequest => ({ endpoint: 'user', params: { user_id: id }, path: `/v1/users/${id}` }) as EndpointRequest;
const name = (username: string): EndpointRequest => ({ endpoint: 'user_by_username', params: { username }, path: `/v1/users/by/username/${username}` }) as EndpointRequest;
const tweet = (id: string): EndpointRequest => ({ endpoint: 'tweet', params: { tweet_id: id }, path: `/v1/tweets/${id}` }) as EndpointRequest;

test('items are matched to data by id and to errors by resource_id, or by value when X leaves resource_id out', { timeout: 5000 }, () => {
  const body = {
    data: [{ id: '3', username: 'c' }, { id: '1', username: 'a' }],
    errors: [
      { value: '2', parameter: 'ids', title: 'Not Found Error', type: `${P}/resource-not-found` },
      { value: '4', parameter: 'ids', resource_id: '4', title: 'Forbidden', type: `${P}/resource-not-found` },
      { value: '5', parameter: 'ids', resource_id: '5', title: 'Weird', type: `${P}/something-else` },
    ],
  };
  assert.deepEqual(batchOutcomes([user('1'), user('2'), user('3'), user('4'), user('5'), user('6')], body), [
    { kind: 'data', body: { data: { id: '1', username: 'a' } } },
    { kind: 'not_found' },
    { kind: 'data', body: { data: { id: '3', username: 'c' } } },
    { kind: 'not_found' },
    { kind: 'errors', type: `${P}/something-else` },
    { kind: 'missing' },
  ]);
});

test('usernames match case-insensitively, in data and in errors', { timeout: 5000 }, () => {
  const body = { data: [{ id: '1', username: 'XDevelopers' }], errors: [{ value: 'NoSuch', parameter: 'usernames', title: 'Not Found Error', type: `${P}/resource-not-found` }] };
  assert.deepEqual(batchOutcomes([name('xdevelopers'), name('nosuch')], body), [{ kind: 'data', body: { data: { id: '1', username: 'XDevelopers' } } }, { kind: 'not_found' }]);
});

test("errors about expansions concern no item asked: an item whose id they name is still its data's", { timeout: 5000 }, () => {
  const body = {
    data: [{ id: '7', author_id: '42' }],
    includes: { users: [{ id: '42' }] },
    errors: [
      { value: '7', parameter: 'pinned_tweet_id', resource_id: '7', title: 'Not Found Error', type: `${P}/resource-not-found` },
      { value: '8', parameter: 'ids', resource_id: '8', section: 'includes', title: 'Not Found Error', type: `${P}/resource-not-found` },
      { value: '9', parameter: 'ids', resource_id: '9', title: 'Authorization Error', type: `${P}/not-authorized-for-resource` },
    ],
  };
  assert.deepEqual(batchOutcomes([tweet('7'), tweet('8'), tweet('9')], body), [
    // The answer's includes go with each item: its author and media are there.
    { kind: 'data', body: { data: { id: '7', author_id: '42' }, includes: { users: [{ id: '42' }] } } },
    { kind: 'missing' },
    { kind: 'not_found' },
  ]);
});

test('a body not of the batch shape fails the whole call', { timeout: 5000 }, () => {
  assert.throws(() => batchOutcomes([user('1'), user('2')], { data: { id: '1' } }), MappingError);
  assert.throws(() => batchOutcomes([user('1'), user('2')], { data: ['x'] }), MappingError);
  assert.throws(() => batchOutcomes([user('1'), user('2')], []), MappingError);
  // Neither data nor errors: every item is missing, none fails the call here.
  assert.deepEqual(batchOutcomes([user('1'), user('2')], {}), [{ kind: 'missing' }, { kind: 'missing' }]);
});
