// A bound for the hit path beyond node:http: the same work as minimal-path.mjs (hit-work.mjs) on
// a bare TCP server that finds request heads itself and writes each answer's head and body in
// one corked write. It is no HTTP server: no body, chunked or size handling, no timeouts, no
// validation; it reads the request line and `X-API-Key` and nothing else, which is enough for
// wrk's GETs. Its ratio to the ceiling says how far serving hits outside node:http's request and
// response objects could take perch, before the parsing and checks a real server needs.
// PERCH_ROOT names the perch checkout whose LineBatcher to use; LOG_FILE the access log (default
// /dev/null). Prints `LISTENING <port>`.
import { createServer } from 'node:net';
import { hitWorkFromEnv } from './hit-work.mjs';

const work = await hitWorkFromEnv();

// node:http's own headers on a keep-alive answer, so the names match the ceiling's.
const TAIL = '\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n';
const NOT_FOUND = 'HTTP/1.1 404 Not Found\r\nContent-Length: 0';
let dateSecond = -1;
let dateValue = '';

/** The Date header's value, formatted once a second as node:http does. */
function date() {
  const now = Date.now();
  const second = Math.floor(now / 1000);
  if (second !== dateSecond) {
    dateSecond = second;
    dateValue = new Date(now).toUTCString();
  }
  return dateValue;
}

function answer(socket, text, start, end) {
  const started = performance.now();
  const lineEnd = text.indexOf('\r\n', start);
  const first = text.indexOf(' ', start);
  const second = text.indexOf(' ', first + 1);
  const method = text.slice(start, first);
  const url = text.slice(first + 1, second);
  let apiKey;
  for (let at = lineEnd + 2; at < end; ) {
    const next = text.indexOf('\r\n', at);
    const stop = next === -1 || next > end ? end : next;
    const colon = text.indexOf(':', at);
    if (colon !== -1 && colon < stop && colon - at === 9 && text.slice(at, colon).toLowerCase() === 'x-api-key') apiKey = text.slice(colon + 1, stop).trim();
    at = stop + 2;
  }
  const hit = work.serve(url, apiKey);
  if (hit === undefined) {
    socket.write(`${NOT_FOUND}\r\nDate: ${date()}${TAIL}`, 'latin1');
    return;
  }
  let head = 'HTTP/1.1 200 OK';
  const pairs = hit.headers;
  for (let i = 0; i < pairs.length; i += 2) head += `\r\n${pairs[i]}: ${pairs[i + 1]}`;
  socket.write(`${head}\r\nDate: ${date()}${TAIL}`, 'latin1');
  socket.write(hit.body);
  work.record(hit, method, url, socket.remoteAddress, started);
}

const sockets = new Set();
const server = createServer({ noDelay: true }, (socket) => {
  sockets.add(socket);
  socket.on('close', () => sockets.delete(socket));
  socket.on('error', () => socket.destroy());
  socket.setEncoding('latin1');
  let pending = '';
  socket.on('data', (chunk) => {
    pending = pending.length === 0 ? chunk : pending + chunk;
    let start = 0;
    socket.cork();
    for (let end = pending.indexOf('\r\n\r\n'); end !== -1; end = pending.indexOf('\r\n\r\n', start)) {
      answer(socket, pending, start, end);
      start = end + 4;
    }
    socket.uncork();
    pending = start === pending.length ? '' : pending.slice(start);
  });
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
process.on('SIGTERM', () => {
  work.flushSync();
  server.close(() => process.exit(0));
  for (const socket of sockets) socket.destroy();
});
