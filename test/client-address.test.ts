import assert from 'node:assert/strict';
import { test } from 'node:test';
import { addressSource } from '../src/auth/client-address.js';

test('a client source: an IPv4 address as it is, an IPv6 address by its /64, a mapped IPv4 address as IPv4', { timeout: 5000 }, () => {
  assert.equal(addressSource('203.0.113.7'), '203.0.113.7');
  assert.equal(addressSource('::ffff:203.0.113.7'), '203.0.113.7');
  assert.equal(addressSource('::FFFF:203.0.113.7'), '203.0.113.7');
  // One /64, however its host half is spelled: one source.
  const sources = ['2001:db8:a:b::1', '2001:0db8:000a:000b:ffff:ffff:ffff:ffff', '2001:DB8:A:B:1:2:3:4', '2001:db8:a:b::1%eth0'].map(addressSource);
  assert.deepEqual(new Set(sources), new Set(['2001:db8:a:b::/64']));
  // The next /64 is another source; so are addresses whose `::` falls in the first half.
  assert.equal(addressSource('2001:db8:a:c::1'), '2001:db8:a:c::/64');
  assert.equal(addressSource('2001:db8::1'), '2001:db8:0:0::/64');
  assert.equal(addressSource('::1'), '0:0:0:0::/64');
  assert.equal(addressSource('::'), '0:0:0:0::/64');
  assert.equal(addressSource('64:ff9b::192.0.2.1'), '64:ff9b:0:0::/64');
  assert.equal(addressSource(undefined), 'unknown');
  assert.equal(addressSource(''), 'unknown');
});
