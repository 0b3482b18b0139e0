import assert from 'node:assert/strict';
import { test } from 'node:test';
import { compileErrors, validate } from '@readme/openapi-parser';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { OPENAPI_DOCUMENT } from '../src/openapi/document.js';
import { request } from 'undici';
import { KEY, startPerch, testConfig } from './helpers/perch.js';

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
  const cases: [template: string, url: string, status: number, key?: string | null, method?: string][] = [
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
    ['/v1/users/{user_id}', '/v1/users/1', 405, undefined, 'DELETE'],
    ['/v1/tweets/{tweet_id}', '/v1/tweets/4040000000000000000', 404],
  ];
  for (const [template, url, status, key, method] of cases) {
    const res = await perch.request(url, { ...(key === undefined ? {} : { key }), ...(method === undefined ? {} : { method }) });
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

const T = { timeout: 20_000 };

test('the document passes a real OpenAPI 3.1 validator (@readme/openapi-parser), and a broken one does not', T, async () => {
  const result = await validate(structuredClone(OPENAPI_DOCUMENT) as never);
  assert.ok(result.valid, result.valid ? '' : compileErrors(result));
  const broken = structuredClone(OPENAPI_DOCUMENT) as { paths: Record<string, { get: { responses: Record<string, { headers: object }> } }> };
  broken.paths['/v1/tweets/{tweet_id}']!.get.responses['200']!.headers = { RateLimit: { $ref: '#/components/headers/Missing' } };
  assert.equal((await validate(broken as never)).valid, false);
});

test('servers, license, every status perch sends, the rate-limit and cache headers and entity indices are documented', T, async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const doc = (await perch.request('/openapi.json', { key: null })).json();
  assert.deepEqual(doc.servers, [{ url: '/', description: 'The perch instance serving this document' }]);
  assert.deepEqual(doc.info.license, { name: 'MIT', identifier: 'MIT' });
  const statuses = ['200', '304', '400', '401', '404', '405', '408', '417', '429', '431', '500', '502', '504'];
  for (const [path, item] of Object.entries(doc.paths as Record<string, { get: { responses: Record<string, { headers: Record<string, unknown> }> } }>)) {
    const responses = item.get.responses;
    assert.deepEqual(Object.keys(responses).sort(), statuses, path);
    for (const name of ['RateLimit', 'RateLimit-Policy', 'Cache-Status', 'X-Request-Id', 'x-rate-limit-reset', 'ETag', 'Last-Modified', 'Vary', 'Content-Encoding']) {
      assert.ok(name in responses['200']!.headers, `${path} 200 documents ${name}`);
    }
    for (const name of ['RateLimit', 'Cache-Status', 'ETag', 'Last-Modified', 'Vary', 'Cache-Control']) assert.ok(name in responses['304']!.headers, `${path} 304 documents ${name}`);
    assert.ok(!('content' in responses['304']!), `${path}: a 304 has no body`);
    assert.ok('Retry-After' in responses['429']!.headers, `${path} 429 documents Retry-After`);
    assert.ok('Allow' in responses['405']!.headers, `${path} 405 documents Allow`);
    assert.ok(!('RateLimit' in responses['401']!.headers), `${path}: a 401 carries no rate-limit headers`);
  }
  for (const name of ['RateLimit', 'RateLimit-Policy', 'Retry-After', 'Cache-Status']) assert.ok(doc.components.headers[name]?.schema, name);
  const entities = doc.components.schemas.Entities.properties;
  for (const kind of ['hashtags', 'urls', 'user_mentions', 'media']) {
    assert.deepEqual(entities[kind].items.properties.indices.items, { type: 'integer', minimum: 0 }, kind);
  }
  // Every header a live 200 carries is documented on it (or is HTTP framing).
  const framing = new Set(['content-type', 'content-length', 'date', 'connection', 'keep-alive']);
  const documentedOn = (status: string) => new Set(Object.keys(doc.paths['/v1/users/{user_id}/tweets'].get.responses[status].headers).map((name) => name.toLowerCase()));
  const page = '/v1/users/1/tweets';
  await perch.request(page);
  // A compressed hit, and its 304 (raw: fetch would hide Content-Encoding once it inflated).
  const compressed = await request(perch.url + page, { headers: { 'x-api-key': KEY, 'accept-encoding': 'gzip' } });
  await compressed.body.dump();
  assert.equal(compressed.headers['content-encoding'], 'gzip');
  const revalidated = await request(perch.url + page, { headers: { 'x-api-key': KEY, 'if-none-match': '*' } });
  await revalidated.body.dump();
  assert.equal(revalidated.statusCode, 304);
  for (const [status, live] of [['200', compressed], ['304', revalidated]] as const) {
    for (const name of Object.keys(live.headers)) assert.ok(documentedOn(status).has(name) || framing.has(name), `${name} is not documented on ${status}`);
  }
});
