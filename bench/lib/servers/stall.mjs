// A server for checking the open-loop generator (open-loop-check.mjs): the hit answer (as the
// ceiling serves it), with its event loop blocked for STALL_MS every STALL_EVERY_MS (50 ms every
// 1000 ms by default), as a long GC pause or a synchronous hiccup would. Prints `LISTENING <port>`.
import { createServer } from 'node:http';
import { hitAnswer } from './hit-answer.mjs';

const stallMs = Number(process.env.STALL_MS ?? 50);
const everyMs = Number(process.env.STALL_EVERY_MS ?? 1000);

const server = createServer(hitAnswer(process.env.HIT_USER_ID ?? '1000000000000000001', 10240));
server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`));
if (stallMs > 0) {
  setInterval(() => {
    const until = performance.now() + stallMs;
    while (performance.now() < until); // the stall is the point: nothing else runs meanwhile
  }, everyMs);
}
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
