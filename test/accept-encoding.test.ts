import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { codingTag, negotiate, type Available } from '../src/server/accept-encoding.js';

const BOTH: Available = { brBytes: 1, gzipBytes: 1 };
const GZIP: Available = { brBytes: 0, gzipBytes: 1 };

test('Accept-Encoding: q-values, identity, * and their edge cases (RFC 9110 12.5.3)', () => {
  const cases: [string | undefined, Available, string | undefined][] = [
    [undefined, BOTH, undefined], // no header: identity, a client that sent none may decode nothing
    ['', BOTH, undefined], // empty: identity only
    ['gzip', BOTH, 'gzip'],
    ['br, gzip', BOTH, 'br'],
    ['gzip, br', BOTH, 'br'], // equal weights: the smaller body
    ['gzip;q=1, br;q=0.5', BOTH, 'gzip'],
    ['br;q=0.999, gzip;q=1.000', BOTH, 'gzip'],
    ['*', BOTH, 'br'],
    ['*;q=0.5, gzip', BOTH, 'gzip'],
    ['br;q=0, *', BOTH, 'gzip'],
    ['*;q=0', BOTH, undefined], // nothing acceptable: identity rather than a 406
    ['identity;q=0, gzip', BOTH, 'gzip'],
    ['gzip;q=0.5, identity', BOTH, undefined], // identity weighs 1, gzip 0.5
    ['gzip;q=0.5', BOTH, 'gzip'], // identity unlisted ranks with the least wanted listed coding
    ['gzip;q=0.5, br;q=0.2', BOTH, 'gzip'],
    ['identity', BOTH, undefined],
    ['GZIP', BOTH, 'gzip'],
    ['  gzip ;  q=0.8 ,BR;Q=0.9', BOTH, 'br'],
    ['x-gzip', BOTH, 'gzip'],
    ['deflate, compress', BOTH, undefined],
    ['gzip;q=2', BOTH, undefined], // malformed weight: the element is ignored
    ['gzip;q=0.0001', BOTH, undefined],
    ['gzip;q=', BOTH, undefined],
    ['gzip;q=0., br;q=1.', BOTH, 'br'],
    ['gzip;q=0, gzip', BOTH, undefined], // the first mention counts: a refusal is not undone
    ['br', GZIP, undefined], // br wanted but not held, gzip not accepted
    ['br, gzip;q=0.5', GZIP, 'gzip'],
    ['*', GZIP, 'gzip'],
    ['gzip', { brBytes: 0, gzipBytes: 0 }, undefined],
    ['gzip', undefined as unknown as Available, undefined],
    [',,,;;', BOTH, undefined],
  ];
  for (const [header, available, expected] of cases) assert.equal(negotiate(header, available), expected, JSON.stringify(header));
});

test('Accept-Encoding: whatever the header, the answer is a held coding the client did not refuse, or identity', () => {
  const coding = fc.constantFrom('br', 'gzip', 'identity', '*', 'x-gzip', 'deflate', 'BR', 'Gzip');
  const weight = fc.oneof(fc.constant(''), fc.constantFrom(';q=0', ';q=1', ';q=0.5', ';q=0.001', ';q=1.0', ';q=2', ';q=abc'));
  const header = fc.array(fc.tuple(coding, weight), { maxLength: 6 }).map((parts) => parts.map(([c, w]) => c + w).join(', '));
  const held = fc.record({ brBytes: fc.constantFrom(0, 1), gzipBytes: fc.constantFrom(0, 1) });
  fc.assert(
    fc.property(header, held, (value, available) => {
      const chosen = negotiate(value, available);
      if (chosen === undefined) return true;
      assert.notEqual(chosen === 'br' ? available.brBytes : available.gzipBytes, 0, 'only a coding the entry has');
      // The first explicit mention of the coding (x-gzip counts as gzip) must not refuse it.
      const first = value
        .split(',')
        .map((p) => p.trim().toLowerCase())
        .find((p) => p.split(';')[0]!.trim().replace(/^x-gzip$/, 'gzip') === chosen && !/q=(2|abc)/.test(p));
      if (first !== undefined) assert.ok(!/;q=0(\.0*)?$/.test(first), `${chosen} was refused in ${value}`);
      return true;
    }),
    { numRuns: 2000 },
  );
});

test('each coding has its own tag, derived from the identity tag', () => {
  assert.equal(codingTag('"abc"', undefined), '"abc"');
  assert.equal(codingTag('"abc"', 'br'), '"abc-br"');
  assert.equal(codingTag('"abc"', 'gzip'), '"abc-gzip"');
});
