// A v1 provider stand-in for the benchmark, run as its own (pinned) process:
//   GET /v1/users/{id}/tweets -> a ~10 KB tweets page;  GET /v1/users/{id} -> a ~1.5 KB user.
// It counts requests (and distinct paths) for the upstream-economy figure:
//   GET /__bench/stats -> {"requests":N,"distinct":M};  POST /__bench/reset zeroes both.
// Prints `LISTENING <port>` once bound to 127.0.0.1.
import { createServer } from 'node:http';
import { bodyFactory } from '../bodies.mjs';

const bodies = bodyFactory({ tweetsBytes: Number(process.env.TWEETS_BYTES ?? 10240), userBytes: Number(process.env.USER_BYTES ?? 1536) });
const TWEETS = /^\/v1\/users\/(\d{1,20})\/tweets(?:\?.*)?$/;
const USER = /^\/v1\/users\/(\d{1,20})(?:\?.*)?$/;
const HEADERS = ['content-type', 'application/json; charset=utf-8'];

let requests = 0;
let distinct = new Set();

const server = createServer((req, res) => {
  const url = req.url ?? '/';
  if (url.startsWith('/__bench/')) {
    if (url === '/__bench/reset' && req.method === 'POST') {
      requests = 0;
      distinct = new Set();
    }
    const body = JSON.stringify({ requests, distinct: distinct.size });
    res.writeHead(200, ['content-type', 'application/json', 'content-length', String(Buffer.byteLength(body))]);
    res.end(body);
    return;
  }
  requests++;
  distinct.add(url);
  let match;
  let body;
  if ((match = TWEETS.exec(url))) body = bodies.tweets(match[1]);
  else if ((match = USER.exec(url))) body = bodies.user(match[1]);
  if (body === undefined) {
    const notFound = '{"error":{"message":"Not found","code":"E404"}}';
    res.writeHead(404, [...HEADERS, 'content-length', String(notFound.length)]);
    res.end(notFound);
    return;
  }
  res.writeHead(200, [...HEADERS, 'content-length', String(body.length)]);
  res.end(body);
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
