// Bounds for the miss path: what a miss costs on node:http and undici when its work is done
// plainly, with no auth, limits, schema check, store, log or metrics. MISS_WORK says how much of
// the work perch cannot skip on a miss is done:
//   hop       forward the request to the upstream through an undici Pool, read the body, answer;
//   parse     the hop, and the body decoded and parsed as JSON before answering (perch must know
//             the provider's answer is JSON before it serves and stores it);
//   compress  parse, and both compressed variants made after the answer with perch's own
//             `encode` (PERCH_ROOT's dist), as perch makes them for every stored page.
// UPSTREAM: the upstream's origin. Prints `LISTENING <port>`.
import { createServer } from 'node:http';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Pool } from 'undici';

const work = process.env.MISS_WORK ?? 'compress';
if (!['hop', 'parse', 'compress'].includes(work)) throw new Error(`MISS_WORK must be hop, parse or compress, not ${work}`);
const { encode } = await import(pathToFileURL(join(process.env.PERCH_ROOT, 'dist', 'src', 'cache', 'compression.js')).href);
const COMPRESSION = { brotli: true, gzip: true, min_bytes: 1024 };
const pool = new Pool(process.env.UPSTREAM, { connections: 4, pipelining: 1 });
const upstreamHeaders = { accept: 'application/json', 'user-agent': 'plain-miss' };

const server = createServer(async (req, res) => {
  try {
    const upstream = await pool.request({ path: req.url, method: 'GET', headers: upstreamHeaders });
    const chunks = [];
    for await (const chunk of upstream.body) chunks.push(chunk);
    const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    if (work !== 'hop') JSON.parse(body.toString('utf8'));
    res.writeHead(upstream.statusCode, ['content-type', 'application/json; charset=utf-8', 'content-length', String(body.length)]);
    res.end(body);
    if (work === 'compress') await encode(body, COMPRESSION);
  } catch (error) {
    if (!res.headersSent) res.writeHead(502).end(String(error));
  }
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => pool.close().then(() => process.exit(0)));
});
