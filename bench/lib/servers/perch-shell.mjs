// A bound for the hit path: perch's own API listener (dist/src/server/listener.js, with the
// server settings a default perch config gives it: timeouts, connection tracking and shedding,
// the clientError handler, the head-size admission) around the ceiling's fixed answer. What it
// loses against the ceiling is what perch's listener costs; what perch loses against it is the
// request path (auth, routing, rate limit, cache lookup, headers, metrics, access log).
// PERCH_ROOT names the perch checkout whose build to use. Prints `LISTENING <port>`.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { hitAnswer } from './hit-answer.mjs';

const root = process.env.PERCH_ROOT;
if (!root) throw new Error('PERCH_ROOT is not set');
const dist = (file) => import(pathToFileURL(join(root, 'dist', 'src', file)).href);
const [{ parseConfig }, { createApiServer }, { createLogger }] = await Promise.all([
  dist('config/load.js'),
  dist('server/listener.js'),
  dist('logging/logger.js'),
]);
const config = parseConfig(
  `server: { host: 127.0.0.1, port: 0 }
auth: { keys: [{ id: bench, key: "perch-bench-key-0123456789abcdef", plan: unlimited }] }
rate_limits: { unlimited: { capacity: 1000000000, refill_per_second: 1000000000 } }
upstreams: { bench: { kind: fixture } }
log: { level: warn }
`,
  {},
);

const server = createApiServer(
  config.server,
  hitAnswer(process.env.HIT_USER_ID ?? '1000000000000000001', Number(process.env.TWEETS_BYTES ?? 10240)),
  createLogger(config.log),
);
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
