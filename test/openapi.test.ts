import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { startPerch, testConfig } from './helpers/perch.js';

interface Operation {
  responses: Record<string, { content: { 'application/json': { schema: object } } }>;
}

test('live responses of all six endpoints and of the errors match the served OpenAPI document', async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const served = await perch.request('/openapi.json', { key: null });
  assert.equal(served.status, 200);
  const doc = served.json();
  assert.equal(doc.openapi, '3.1.0');
  const ajv = new Ajv2020({ strict: false });
  ajv.addSchema({ $id: 'doc', components: doc.components });
  const schemaFor = (path: string, status: number) => {
    const operation = doc.paths[path].get as Operation;
    const response = operation.responses[String(status)];
    assert.ok(response !== undefined, `${path} documents ${status}`);
    // Rebase the document's local refs onto the registered copy of its components.
    return JSON.parse(JSON.stringify(response.content['application/json'].schema).replaceAll('"#/components', '"doc#/components'));
  };

  const firstPage = (await perch.request('/v1/users/1234567890123456789/tweets')).json();
  const cases: [template: string, url: string, status: number, key?: string | null][] = [
    ['/v1/users/{user_id}', '/v1/users/1234567890123456789', 200],
    ['/v1/users/by/username/{username}', '/v1/users/by/username/Perch_Demo', 200],
    ['/v1/users/{user_id}/tweets', '/v1/users/1234567890123456789/tweets', 200],
    ['/v1/users/{user_id}/tweets', `/v1/users/1234567890123456789/tweets?cursor=${encodeURIComponent(firstPage.data.cursor_bottom)}`, 200],
    ['/v1/users/{user_id}/replies', '/v1/users/1234567890123456789/replies', 200],
    ['/v1/users/{user_id}/following', '/v1/users/1234567890123456789/following?count=5', 200],
    ['/v1/tweets/{tweet_id}', '/v1/tweets/1234567890123456789', 200],
    ['/v1/users/{user_id}', '/v1/users/abc', 400],
    ['/v1/users/{user_id}/following', '/v1/users/1/following?count=500', 400],
    ['/v1/users/{user_id}', '/v1/users/1', 401, null],
    ['/v1/users/{user_id}', '/v1/users/4040000000000000000', 404],
    ['/v1/tweets/{tweet_id}', '/v1/tweets/4040000000000000000', 404],
  ];
  for (const [template, url, status, key] of cases) {
    const res = await perch.request(url, key === undefined ? {} : { key });
    assert.equal(res.status, status, url);
    const validate = ajv.compile(schemaFor(template, status));
    assert.ok(validate(res.json()), `${url}: ${ajv.errorsText(validate.errors)}`);
  }
  // The error schema is closed: an extra member would be a drift from the interface's shape.
  const errorSchema = ajv.compile(schemaFor('/v1/users/{user_id}', 404));
  assert.equal(errorSchema({ error: { message: 'x', code: 'E404' }, stack: 'leak' }), false);
});

test('the document describes exactly the six endpoints with the API key scheme', async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const doc = (await perch.request('/openapi.json', { key: null })).json();
  assert.deepEqual(Object.keys(doc.paths).sort(), [
    '/v1/tweets/{tweet_id}',
    '/v1/users/by/username/{username}',
    '/v1/users/{user_id}',
    '/v1/users/{user_id}/following',
    '/v1/users/{user_id}/replies',
    '/v1/users/{user_id}/tweets',
  ]);
  assert.deepEqual(doc.components.securitySchemes.apiKey, { type: 'apiKey', in: 'header', name: 'X-API-Key' });
});
