// A throwaway redis-server for the two-instance economy run, and a minimal RESP client for the
// two commands the bench needs (FLUSHALL between runs, DBSIZE to see whether perch used Redis).
import { execFileSync } from 'node:child_process';
import { connect } from 'node:net';
import { freePort, start, waitForLine } from './procs.mjs';

const BINARY = process.env.REDIS_SERVER ?? 'redis-server';

export function redisAvailable() {
  try {
    execFileSync(BINARY, ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

export async function startRedis(ctx) {
  const port = await freePort();
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--protected-mode', 'no'];
  const proc = start('redis-server', BINARY, args, { cpu: ctx.pin.serverCpu });
  await waitForLine(proc, /Ready to accept connections/);
  return { proc, port, url: `redis://127.0.0.1:${port}` };
}

/** Sends one command and resolves with its reply: an integer, a simple string or a bulk string. */
export function redisCommand(port, ...args) {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let reply = '';
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`redis ${args[0]}: no reply`));
    }, 5000);
    socket.on('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    socket.on('data', (data) => {
      reply += data.toString();
      const nl = reply.indexOf('\r\n');
      if (nl < 0) return;
      const line = reply.slice(0, nl);
      // A bulk string: its length, then that many bytes (INFO answers ASCII, so bytes = chars).
      if (line.startsWith('$') && reply.length < nl + 2 + Number(line.slice(1))) return;
      clearTimeout(timer);
      socket.end();
      if (line.startsWith('-')) reject(new Error(`redis ${args[0]}: ${line.slice(1)}`));
      else if (line.startsWith('$')) resolve(reply.slice(nl + 2, nl + 2 + Number(line.slice(1))));
      else resolve(line.startsWith(':') ? Number(line.slice(1)) : line.slice(1));
    });
    socket.write(`*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`);
  });
}
