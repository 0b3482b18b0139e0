// The fixed answer of the hit-path bounds: the exact bytes perch serves from its cache for the
// benchmark page, with the response headers perch sends on a hit and values of the same length
// (bench/scenarios/hit.mjs checks the names still match perch's).
import { createHash } from 'node:crypto';
import { bodyFactory } from '../bodies.mjs';

const REQUEST_ID = '3f1c2a9e-6b7d-4c1e-9a2b-5d8e7f6a4b3c'; // same length as perch's random UUIDs

/** A request handler answering every request with the hit page for `userId`. */
export function hitAnswer(userId, tweetsBytes) {
  const body = bodyFactory({ tweetsBytes }).tweets(userId);
  const length = String(body.length);
  const etag = entityTag(body);
  const lastModified = new Date().toUTCString();
  return (req, res) => {
    res.writeHead(200, [
      'cache-status', 'perch; hit; ttl=3599',
      'age', '0',
      'x-request-id', REQUEST_ID,
      'ratelimit-policy', '"unlimited";q=1000000000;w=1',
      'ratelimit', '"unlimited";r=999999999;t=0',
      'cache-control', 'private, max-age=3599',
      'vary', 'X-API-Key',
      'etag', etag,
      'last-modified', lastModified,
      'content-type', 'application/json; charset=utf-8',
      'content-length', length,
    ]);
    res.end(body);
  };
}

/** perch's entity tag for a cached body (src/cache/entry.ts): 22 characters of its SHA-256, quoted. */
export function entityTag(body) {
  return `"${createHash('sha256').update(body).digest('base64url').slice(0, 22)}"`;
}
