// A bound for the hit path: the work every perch hit must do (hit-work.mjs) on a bare node:http
// server, with no listener hardening, no config and no error paths. Its ratio to the ceiling is
// what a hit costs on node:http when that work is done, so it bounds what perch can reach on this
// design. PERCH_ROOT names the perch checkout whose LineBatcher to use; LOG_FILE the access log
// (default /dev/null). Prints `LISTENING <port>`.
import { createServer } from 'node:http';
import { hitWorkFromEnv } from './hit-work.mjs';

const work = await hitWorkFromEnv();

const server = createServer((req, res) => {
  const started = performance.now();
  const answer = work.serve(req.url, req.headers['x-api-key']);
  if (answer === undefined) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, answer.headers);
  res.end(answer.body);
  work.record(answer, req.method, req.url, req.socket.remoteAddress, started);
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
process.on('SIGTERM', () => {
  work.flushSync();
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
