// The hit-path ceiling: a bare node:http server answering, for every request, the exact bytes
// perch serves from its cache for the benchmark page, with the same response headers perch sends
// on a hit, values of the same length (cache-status, age, x-request-id, ratelimit-policy,
// ratelimit, cache-control, vary, content-type, content-length, plus node's own
// date/connection/keep-alive; bench/scenarios/hit.mjs checks the names still match). No auth, no
// routing, no cache lookup, no rate limit, no log: what node:http alone costs on this machine.
// Prints `LISTENING <port>`.
import { createServer } from 'node:http';
import { bodyFactory } from '../bodies.mjs';

const userId = process.env.HIT_USER_ID ?? '1000000000000000001';
const body = bodyFactory({ tweetsBytes: Number(process.env.TWEETS_BYTES ?? 10240) }).tweets(userId);
const length = String(body.length);
const REQUEST_ID = '3f1c2a9e-6b7d-4c1e-9a2b-5d8e7f6a4b3c'; // same length as perch's random UUIDs

const server = createServer((req, res) => {
  res.writeHead(200, [
    'cache-status', 'perch; hit; ttl=3599',
    'age', '0',
    'x-request-id', REQUEST_ID,
    'ratelimit-policy', '"unlimited";q=1000000000;w=1',
    'ratelimit', '"unlimited";r=999999999;t=0',
    'cache-control', 'private, max-age=3599',
    'vary', 'X-API-Key',
    'content-type', 'application/json; charset=utf-8',
    'content-length', length,
  ]);
  res.end(body);
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
