import { isIPv6 } from 'node:net';

/**
 * The source a client address belongs to, for bounds per source: an IPv4 address as it is, the
 * /64 of an IPv6 address (the smallest block a subscriber is usually given, so one source cannot
 * pose as 2^64 of them), an IPv4-mapped IPv6 address as its IPv4 one. `unknown` when the socket
 * had none (it closed before the request was read).
 */
export function addressSource(address: string | undefined): string {
  if (address === undefined || address === '') return 'unknown';
  const bare = address.replace(/%.*$/, '');
  const mapped = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/i.exec(bare);
  if (mapped !== null) return mapped[1]!;
  if (!isIPv6(bare)) return bare;
  return `${groups(bare).slice(0, 4).join(':')}::/64`;
}

/** The eight groups of an IPv6 address, `::` expanded, each without leading zeros and in lower case. */
function groups(address: string): string[] {
  const [head = '', tail] = address.toLowerCase().split('::');
  const left = head === '' ? [] : head.split(':');
  const right = tail === undefined || tail === '' ? [] : tail.split(':');
  // An embedded IPv4 tail (::1.2.3.4) is two groups; it never reaches the first four.
  const width = [...left, ...right].reduce((n, group) => n + (group.includes('.') ? 2 : 1), 0);
  const all = tail === undefined ? left : [...left, ...Array.from({ length: 8 - width }, () => '0'), ...right];
  return all.map((group) => group.replace(/^0+(?=.)/, ''));
}
