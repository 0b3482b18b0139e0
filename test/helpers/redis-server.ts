import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { TestContext } from 'node:test';

export interface TestRedis {
  readonly port: number;
  readonly url: string;
  /** SIGKILL: the server vanishes mid-conversation, connections are reset. */
  kill(): Promise<void>;
  /** SIGSTOP / SIGCONT: the server keeps its sockets open but answers nothing. */
  freeze(): void;
  thaw(): void;
  /** Starts it again on the same port after `kill`, empty. */
  restart(): Promise<void>;
}

/** The redis-server binary: `REDIS_SERVER`, else the one on PATH (.ci/run installs it). */
const BINARY = process.env.REDIS_SERVER ?? 'redis-server';

/**
 * A real redis-server started for one test on a free port, without persistence, stopped when the
 * test ends. Tests that need Redis faults (kill, freeze) use this rather than a shared server.
 */
export async function startRedis(t: TestContext, extraArgs: string[] = []): Promise<TestRedis> {
  const port = await freePort();
  let child: ChildProcess | undefined;

  async function start(): Promise<void> {
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--protected-mode', 'no', ...extraArgs];
    const proc = spawn(BINARY, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    child = proc;
    await new Promise<void>((resolve, reject) => {
      let output = '';
      const onData = (data: Buffer) => {
        output += data.toString();
        if (output.includes('Ready to accept connections')) {
          proc.stdout!.off('data', onData);
          proc.stdout!.resume();
          resolve();
        }
      };
      proc.stdout!.on('data', onData);
      proc.once('error', reject);
      proc.once('exit', (code) => reject(new Error(`redis-server exited with ${code}: ${output}`)));
    });
  }

  async function stop(signal: NodeJS.Signals): Promise<void> {
    const proc = child;
    if (proc === undefined || proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    proc.kill('SIGCONT');
    proc.kill(signal);
    await exited;
  }

  await start();
  t.after(() => stop('SIGKILL'));
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    kill: () => stop('SIGKILL'),
    freeze: () => void child?.kill('SIGSTOP'),
    thaw: () => void child?.kill('SIGCONT'),
    restart: async () => {
      await stop('SIGKILL');
      await start();
    },
  };
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}
