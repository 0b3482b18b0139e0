// The hit-path ceiling: a bare node:http server answering, for every request, the exact bytes
// perch serves from its cache for the benchmark page, with the same response headers perch sends
// on a hit, values of the same length (cache-status, age, x-request-id, ratelimit-policy,
// ratelimit, cache-control, vary, etag, last-modified, content-type, content-length, plus node's
// own date/connection/keep-alive; see hit-answer.mjs). No auth, no routing, no cache lookup, no rate
// limit, no log: what node:http alone costs on this machine. Prints `LISTENING <port>`.
import { createServer } from 'node:http';
import { hitAnswer } from './hit-answer.mjs';

const server = createServer(hitAnswer(process.env.HIT_USER_ID ?? '1000000000000000001', Number(process.env.TWEETS_BYTES ?? 10240)));
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
