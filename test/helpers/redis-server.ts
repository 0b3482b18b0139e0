import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { TestContext } from 'node:test';
import { onCleanup } from './cleanup.js';

export interface TestRedis {
  readonly port: number;
  /** `redis://127.0.0.1:<port>`, or `rediss://` when started with `tls`. */
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

/** PEM files for a TLS server (see tls-files.ts). */
export interface TestTlsFiles {
  readonly cert: string;
  readonly key: string;
}

export interface TestRedisOptions {
  /** Config file given first (sentinels need one they can rewrite). */
  readonly configFile?: string;
  /** Serve TLS only, on the port, with this certificate (clients are not asked for one). */
  readonly tls?: TestTlsFiles;
}

/**
 * A real redis-server started for one test on a free port, without persistence, stopped when the
 * test ends. Tests that need Redis faults (kill, freeze) use this rather than a shared server.
 */
export async function startRedis(t: TestContext, extraArgs: string[] = [], options: TestRedisOptions = {}): Promise<TestRedis> {
  const port = await freePort();
  let child: ChildProcess | undefined;
  const { tls } = options;
  const listen = tls === undefined
    ? ['--port', String(port)]
    : ['--port', '0', '--tls-port', String(port), '--tls-cert-file', tls.cert, '--tls-key-file', tls.key, '--tls-ca-cert-file', tls.cert, '--tls-auth-clients', 'no'];

  async function start(): Promise<void> {
    const args = [...(options.configFile === undefined ? [] : [options.configFile]), ...listen, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--protected-mode', 'no', ...extraArgs];
    const proc = spawn(BINARY, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    child = proc;
    await new Promise<void>((resolve, reject) => {
      let output = '';
      const onData = (data: Buffer) => {
        output += data.toString();
        if (output.includes('Ready to accept connections') || output.includes('Sentinel ID is')) {
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
  onCleanup(t, () => stop('SIGKILL'));
  return {
    port,
    url: `${tls === undefined ? 'redis' : 'rediss'}://127.0.0.1:${port}`,
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
