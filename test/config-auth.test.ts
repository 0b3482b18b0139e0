import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConfigError, parseConfig } from '../src/config/load.js';

const PLANS = 'rate_limits: { resale: { capacity: 5, refill_per_second: 1 } }\nupstreams: { main: { kind: v1, url: "https://provider.example" } }';

function problemsOf(auth: string): readonly string[] {
  try {
    parseConfig(`auth: ${auth}\n${PLANS}`, {});
  } catch (error) {
    assert.ok(error instanceof ConfigError, `expected ConfigError, got ${String(error)}`);
    return error.problems;
  }
  return assert.fail('expected the configuration to be rejected');
}

describe('auth.mode: upstream', () => {
  it('needs only a default plan, and fills the other defaults', { timeout: 5000 }, () => {
    const config = parseConfig(`auth: { mode: upstream, default_plan: resale }\n${PLANS}`, {});
    assert.deepEqual(config.auth, {
      mode: 'upstream',
      keys: [],
      default_plan: 'resale',
      verify_ttl_seconds: 300,
      reject_ttl_seconds: 60,
      remembered_keys: 100000,
      verify_rate_per_second: 1,
      verify_burst: 20,
      verify_source_share: 0.25,
      revalidate_rate_per_second: 10,
      revalidate_burst: 100,
    });
  });

  it('takes every option', { timeout: 5000 }, () => {
    const config = parseConfig(
      `auth: { mode: upstream, default_plan: resale, verify_ttl_seconds: 30, reject_ttl_seconds: 5, remembered_keys: 10 }\n${PLANS}`,
      {},
    );
    assert.deepEqual(
      [config.auth.verify_ttl_seconds, config.auth.reject_ttl_seconds, config.auth.remembered_keys],
      [30, 5, 10],
    );
  });

  it('lets an x_v2 upstream go without a token of its own, which mode keys still requires', { timeout: 5000 }, () => {
    const upstreams = 'rate_limits: { resale: { capacity: 5, refill_per_second: 1 } }\nupstreams: { x: { kind: x_v2 } }';
    const config = parseConfig(`auth: { mode: upstream, default_plan: resale }\n${upstreams}`, {});
    assert.deepEqual(config.upstreams.x?.kind === 'x_v2' && config.upstreams.x.credentials, [{ id: 'default', headers: {} }]);
    assert.throws(
      () => parseConfig(`auth: { keys: [{ id: a, key: "0123456789abcdef0", plan: resale }] }\n${upstreams}`, {}),
      (error: unknown) => error instanceof ConfigError && error.problems.includes('upstreams.x.credentials: is required for x_v2 (or the bearer_token shorthand)'),
    );
  });

  it('reports each problem by its key path', { timeout: 5000 }, () => {
    const cases: [string, string[]][] = [
      ['{ mode: upstream }', ['auth.default_plan: is required']],
      ['{ mode: upstream, default_plan: gold }', ['auth.default_plan: names no entry of rate_limits ("gold")']],
      [
        '{ mode: upstream, default_plan: resale, keys: [{ id: a, key: "0123456789abcdef0", plan: resale }] }',
        ['auth.keys: must be absent with mode: upstream (the provider checks every key)'],
      ],
      ['{ mode: upstream, default_plan: resale, verify_ttl_seconds: 0 }', ['auth.verify_ttl_seconds: must be an integer from 1 to 86400']],
      ['{ mode: upstream, default_plan: resale, reject_ttl_seconds: 86401 }', ['auth.reject_ttl_seconds: must be an integer from 1 to 86400']],
      ['{ mode: upstream, default_plan: resale, remembered_keys: 0 }', ['auth.remembered_keys: must be an integer from 1 to 10000000']],
      [
        '{ mode: upstream, default_plan: resale, verify_source_share: 5e-324 }',
        [
          "auth.verify_source_share: must be at least 1 / (999999999999999 * verify_rate_per_second) (one source's keys wait at most 999999999999999 seconds for a turn, the largest integer Retry-After carries)",
        ],
      ],
      [
        '{ mode: upstream, default_plan: resale, revalidate_rate_per_second: 1e-300 }',
        ['auth.revalidate_rate_per_second: must be at least 1 / 999999999999999 (an accepted key waits at most 999999999999999 seconds for a turn, the largest integer Retry-After carries)'],
      ],
      ['{ mode: upstream, default_plan: resale, verify_ttl: 5 }', ['auth.verify_ttl: unknown key (did you mean "verify_ttl_seconds"?)']],
      ['{ mode: both, keys: [{ id: a, key: "0123456789abcdef0", plan: resale }] }', ['auth.mode: must be one of keys, upstream']],
    ];
    for (const [auth, expected] of cases) assert.deepEqual(problemsOf(auth), expected, auth);
    // The smallest share of a turn a second whose wait is an integer of 15 digits.
    assert.equal(parseConfig(`auth: { mode: upstream, default_plan: resale, verify_source_share: 2e-15 }\n${PLANS}`, {}).auth.verify_source_share, 2e-15);
  });

  it('refuses options of mode upstream in mode keys, and still needs keys there', { timeout: 5000 }, () => {
    assert.deepEqual(problemsOf('{ keys: [{ id: a, key: "0123456789abcdef0", plan: resale }], default_plan: resale, verify_ttl_seconds: 5 }'), [
      'auth.default_plan: applies only with mode: upstream',
      'auth.verify_ttl_seconds: applies only with mode: upstream',
    ]);
    assert.deepEqual(problemsOf('{ mode: keys }'), ['auth.keys: is required (at least one key)']);
  });
});
