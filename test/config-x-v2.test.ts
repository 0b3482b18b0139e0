import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import { stringify } from 'yaml';
import { ConfigError, parseConfig } from '../src/config/load.js';

const TOKEN = 'AAAAAAAAAAAAAAAAAAAAAMLheAAAAAAA0%2BuSeid%2BULvsea4JtiGRiSDSJSI%3DEUifiRBkKG5E2XzMDjRfl76ZC9Ub0wnz4XsNiRVBChTYbJcE3F';

/** A valid configuration whose only upstream is `x`, with `settings` as its keys. */
function withX(settings: Record<string, unknown>): string {
  return stringify({
    auth: { keys: [{ id: 'alpha', sha256: createHash('sha256').update('alpha-secret-0123456789').digest('hex'), plan: 'small' }] },
    rate_limits: { small: { capacity: 5, refill_per_second: 1 } },
    upstreams: { x: { kind: 'x_v2', ...settings } },
  });
}

function problems(settings: Record<string, unknown>): readonly string[] {
  try {
    parseConfig(withX(settings), {});
  } catch (error) {
    assert.ok(error instanceof ConfigError);
    return error.problems;
  }
  assert.fail('expected the configuration to be rejected');
}

describe('parseConfig: x_v2 upstreams', { timeout: 10_000 }, () => {
  it('applies the x_v2 defaults: X\'s origin, cool-down per endpoint, the v1 connection defaults, no trace propagation', () => {
    const x = parseConfig(withX({ bearer_token: TOKEN }), {}).upstreams.x;
    assert.ok(x?.kind === 'x_v2');
    assert.deepEqual(
      [x.url, x.cooldown_scope, x.credentials, x.timeout_ms, x.connections, x.max_body_bytes, x.retry_after_default_seconds, x.usage_cap_seconds, x.propagate_trace],
      ['https://api.twitter.com', 'endpoint', [{ id: 'default', headers: { Authorization: `Bearer ${TOKEN}` } }], 5000, 64, 8388608, 60, 86400, false],
    );
  });

  it('reads a pool of tokens, a stand-in url, an explicit scope and the protection keys', () => {
    const x = parseConfig(
      withX({
        url: 'http://127.0.0.1:9999',
        credentials: [
          { id: 'app-one', bearer_token: '${X_ONE}' },
          { id: 'app-two', bearer_token: '${X_TWO}' },
        ],
        cooldown_scope: 'upstream',
        quota: { requests: 900, per_seconds: 900 },
      }),
      { X_ONE: 'one%3Dtoken', X_TWO: 'two-token==' },
    ).upstreams.x;
    assert.ok(x?.kind === 'x_v2');
    assert.deepEqual(x.credentials, [
      { id: 'app-one', headers: { Authorization: 'Bearer one%3Dtoken' } },
      { id: 'app-two', headers: { Authorization: 'Bearer two-token==' } },
    ]);
    assert.deepEqual([x.url, x.cooldown_scope, x.quota], ['http://127.0.0.1:9999', 'upstream', { requests: 900, per_seconds: 900 }]);
  });

  const cases: [string, Record<string, unknown>, string[]][] = [
    ['no token', {}, ['upstreams.x.credentials: is required for x_v2 (or the bearer_token shorthand)']],
    [
      'both forms',
      { bearer_token: TOKEN, credentials: [{ id: 'a', bearer_token: TOKEN }] },
      ['upstreams.x.bearer_token: give either bearer_token or credentials, not both'],
    ],
    ['empty list', { credentials: [] }, ['upstreams.x.credentials: must be a non-empty list of { id, bearer_token }']],
    ['entry without token', { credentials: [{ id: 'a' }] }, ['upstreams.x.credentials[0].bearer_token: is required']],
    ['repeated id', { credentials: [{ id: 'a', bearer_token: 'x1' }, { id: 'a', bearer_token: 'x2' }] }, ['upstreams.x.credentials[1].id: repeats "a"']],
    ['headers are v1 only', { bearer_token: TOKEN, headers: { 'X-Key': 'k' } }, ['upstreams.x.headers: unknown key']],
    [
      'the generic { id, headers } form, refused with what to write',
      { credentials: [{ id: 'a', headers: { Authorization: `Bearer ${TOKEN}` } }] },
      [
        'upstreams.x.credentials[0].headers: unknown key (an x_v2 credential is { id, bearer_token }: give the token as bearer_token, perch sends it as Authorization: Bearer)',
        'upstreams.x.credentials[0].bearer_token: is required',
      ],
    ],
    [
      'a pasted "Bearer " prefix',
      { bearer_token: `Bearer ${TOKEN}` },
      ['upstreams.x.bearer_token: must be a bearer token: letters, digits and -._~+/% then optional = (no "Bearer " prefix, no spaces)'],
    ],
    ['url with a path', { bearer_token: TOKEN, url: 'https://api.twitter.com/2' }, ['upstreams.x.url: must not have a path (give the origin only)']],
    ['bad scope', { bearer_token: TOKEN, cooldown_scope: 'credential' }, ['upstreams.x.cooldown_scope: must be "upstream" or "endpoint"']],
  ];
  for (const [name, settings, expected] of cases) it(name, () => assert.deepEqual(problems(settings), expected));

  it('never puts a token in a problem message', () => {
    const secret = 'secret token with spaces';
    const found = problems({ credentials: [{ id: 'a', bearer_token: secret }] });
    assert.equal(found.length, 1);
    assert.ok(!found.join('\n').includes(secret));
  });
});
