// The memory scenario's bound: a cache done plainly on node:http and undici, with Node's own
// defaults. A miss is forwarded through an undici Pool and its body kept as a Buffer in a Map,
// the oldest dropped once the bodies pass MAX_BYTES; a hit is answered from the Map. No auth,
// limits, compression, log or metrics: what holding `max_bytes` of bodies costs a Node process
// when nothing is done about it. UPSTREAM: the upstream's origin. Prints `LISTENING <port>`.
import { createServer } from 'node:http';
import { Pool } from 'undici';

const maxBytes = Number(process.env.MAX_BYTES);
if (!(maxBytes > 0)) throw new Error('MAX_BYTES must be a positive number of bytes');
const pool = new Pool(process.env.UPSTREAM, { connections: 64, pipelining: 1 });
const upstreamHeaders = { accept: 'application/json', 'user-agent': 'plain-cache' };
const bodies = new Map();
let held = 0;

function answer(res, status, body) {
  res.writeHead(status, ['content-type', 'application/json; charset=utf-8', 'content-length', String(body.length)]);
  res.end(body);
}

const server = createServer(async (req, res) => {
  const cached = bodies.get(req.url);
  if (cached !== undefined) return answer(res, 200, cached);
  try {
    const upstream = await pool.request({ path: req.url, method: 'GET', headers: upstreamHeaders });
    const chunks = [];
    for await (const chunk of upstream.body) chunks.push(chunk);
    const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    answer(res, upstream.statusCode, body);
    if (upstream.statusCode !== 200 || bodies.has(req.url)) return;
    bodies.set(req.url, body);
    held += body.length;
    for (const [url, oldest] of bodies) {
      if (held <= maxBytes) break;
      bodies.delete(url);
      held -= oldest.length;
    }
  } catch (error) {
    if (!res.headersSent) res.writeHead(502).end(String(error));
  }
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => pool.close().then(() => process.exit(0)));
});
