/**
 * Content negotiation on `Accept-Encoding` (RFC 9110 12.5.3), for the codings perch stores.
 * Pure: it sees the header and the codings available, never the response.
 */

/** A coding perch may have a body in, best first: on equal weights the smaller body wins. */
export type Coding = 'br' | 'gzip';

const PREFERENCE: readonly Coding[] = ['br', 'gzip'];
const QVALUE = /^(?:0(?:\.\d{0,3})?|1(?:\.0{0,3})?)$/;

/** The codings an entry has: the length of each (0 where it has none), as a cache entry holds them. */
export interface Available {
  readonly brBytes: number;
  readonly gzipBytes: number;
}

// Clients send the same few header values over and over: each is parsed once. Bounded in count
// and length, so a client sending a new value per request costs a parse each, not memory.
const MEMO_LIMIT = 64;
const MEMO_MAX_LENGTH = 256;
const memo = new Map<string, Map<string, number>>();

function parsed(header: string): Map<string, number> {
  if (header.length > MEMO_MAX_LENGTH) return weights(header);
  let q = memo.get(header);
  if (q === undefined) {
    q = weights(header);
    if (memo.size >= MEMO_LIMIT) memo.clear();
    memo.set(header, q);
  }
  return q;
}

/** The lowest positive weight listed: an unlisted identity's rank. */
function lowest(q: Map<string, number>): number {
  let min = 1;
  for (const weight of q.values()) if (weight > 0 && weight < min) min = weight;
  return min;
}

/** Weights a header gives, by lower-cased coding; an element with a malformed weight is ignored. */
function weights(header: string): Map<string, number> {
  const found = new Map<string, number>();
  for (const element of header.split(',')) {
    const [name = '', ...params] = element.split(';');
    let coding = name.trim().toLowerCase();
    if (coding === '') continue;
    // RFC 9110 8.4.1.3: a recipient should treat x-gzip as gzip.
    if (coding === 'x-gzip') coding = 'gzip';
    let q = 1;
    let valid = true;
    for (const param of params) {
      const [key = '', value = ''] = param.split('=');
      if (key.trim().toLowerCase() !== 'q') continue;
      const text = value.trim();
      valid = QVALUE.test(text);
      q = Number(text);
    }
    // The first mention of a coding counts; a repeat cannot undo a refusal.
    if (valid && !found.has(coding)) found.set(coding, q);
  }
  return found;
}

/**
 * The coding to send, or undefined for the identity body. `available`: the codings the entry
 * has. No header, or an empty one, means identity (RFC 9110 12.5.3: a client that sent none may
 * not decode anything). A listed coding takes its own weight, one not listed takes `*`'s, else 0.
 * Identity is acceptable unless `identity;q=0`, or `*;q=0` without identity listed; unlisted, it
 * ranks with the least wanted coding the client listed (as the `negotiator` package does), so
 * `gzip;q=0.5` alone still means "gzip, please". The highest weight wins, a compressed coding over
 * identity on a tie. When nothing acceptable is available,
 * perch sends the identity body rather than a 406: a read API is better answered in a coding the
 * client said it dislikes than not at all (RFC 9110 12.1 lets a server disregard negotiation).
 */
export function negotiate(header: string | undefined, available: Available | undefined): Coding | undefined {
  if (header === undefined || header === '' || available === undefined) return undefined;
  const q = parsed(header);
  const star = q.get('*');
  const identity = q.get('identity') ?? star ?? lowest(q);
  let best: Coding | undefined;
  let bestQ = 0;
  for (const coding of PREFERENCE) {
    if ((coding === 'br' ? available.brBytes : available.gzipBytes) === 0) continue;
    const weight = q.get(coding) ?? star ?? 0;
    if (weight > bestQ) {
      best = coding;
      bestQ = weight;
    }
  }
  return best !== undefined && bestQ >= identity ? best : undefined;
}

/**
 * The tag of one coding of a body whose identity tag is `etag`. Each coding is a representation
 * of its own, so it needs a strong tag of its own (RFC 9110 8.8.3): a cache that stored the gzip
 * bytes must not be told by a 304 that they are the identity bytes.
 */
export function codingTag(etag: string, coding: Coding | undefined): string {
  return coding === undefined ? etag : `${etag.slice(0, -1)}-${coding}"`;
}
