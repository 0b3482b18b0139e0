import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { promisify } from 'node:util';
import { pollFor } from './perch.js';
import { startRedis, type TestRedis } from './redis-server.js';
import { onCleanup } from './cleanup.js';

const run = promisify(execFile);
const CLI = process.env.REDIS_CLI ?? 'redis-cli';

export const MASTER_NAME = 'perchmaster';

export interface TestSentinels {
  /** The master the sentinels were started with, then its replica. */
  readonly master: TestRedis;
  readonly replica: TestRedis;
  readonly sentinels: readonly TestRedis[];
  /** `127.0.0.1:<port>` of each sentinel, as `cache.redis.sentinels` takes them. */
  readonly addresses: readonly string[];
  /** The port the sentinels name as master now (asked of the first sentinel that answers). */
  masterPort(): Promise<number>;
  /** redis-cli against a data node (with the data password): its trimmed output. */
  cli(port: number, ...args: string[]): Promise<string>;
}

export interface TestSentinelOptions {
  /** `requirepass` on master and replica (the replica's `masterauth` too). */
  readonly password: string;
  /** `requirepass` on the sentinels themselves. */
  readonly sentinelPassword: string;
  /** How long a master may not answer before a sentinel thinks it down. */
  readonly downAfterMs: number;
  readonly timeoutMs?: number;
}

/**
 * A master, one replica and three sentinels (quorum 2), all real processes on free ports, with
 * passwords everywhere; their files in a temporary directory. Resolves once every sentinel knows
 * the replica and the two other sentinels, so a failover can happen; when the test ends, every
 * process is killed and the directory removed.
 */
export async function startSentinels(t: TestContext, options: TestSentinelOptions): Promise<TestSentinels> {
  const { password, sentinelPassword, downAfterMs, timeoutMs = 20_000 } = options;
  const dir = await mkdtemp(join(tmpdir(), 'perch-sentinel-'));
  const processes: TestRedis[] = [];
  onCleanup(t, async () => {
    await Promise.all(processes.map((p) => p.kill()));
    await rm(dir, { recursive: true, force: true });
  });
  const auth = ['--requirepass', password, '--masterauth', password, '--dir', dir];
  const master = await startRedis(t, auth);
  processes.push(master);
  const replica = await startRedis(t, [...auth, '--replicaof', '127.0.0.1', String(master.port)]);
  processes.push(replica);
  const cli = async (port: number, ...args: string[]): Promise<string> =>
    (await run(CLI, ['-h', '127.0.0.1', '-p', String(port), '-a', password, '--no-auth-warning', ...args], { timeout: timeoutMs })).stdout.trim();
  const sentinelCli = async (port: number, ...args: string[]): Promise<string> =>
    (await run(CLI, ['-h', '127.0.0.1', '-p', String(port), '-a', sentinelPassword, '--no-auth-warning', ...args], { timeout: timeoutMs })).stdout.trim();
  const deadline = Date.now() + timeoutMs;
  const until = (what: string, check: () => Promise<boolean>) =>
    pollFor(async () => ((await check().catch(() => false)) ? true : undefined), deadline - Date.now(), 50).catch(() => {
      throw new Error(`${what} not in time`);
    });
  await until('replica link', async () => (await cli(replica.port, 'info', 'replication')).includes('master_link_status:up'));

  const sentinels: TestRedis[] = [];
  for (let i = 0; i < 3; i++) {
    const file = join(dir, `sentinel-${i}.conf`);
    await writeFile(
      file,
      [
        `sentinel monitor ${MASTER_NAME} 127.0.0.1 ${master.port} 2`,
        `sentinel auth-pass ${MASTER_NAME} ${password}`,
        `sentinel down-after-milliseconds ${MASTER_NAME} ${downAfterMs}`,
        `sentinel failover-timeout ${MASTER_NAME} ${Math.max(2000, downAfterMs * 3)}`,
        `sentinel sentinel-pass ${sentinelPassword}`,
        `requirepass ${sentinelPassword}`,
        '',
      ].join('\n'),
    );
    const sentinel = await startRedis(t, ['--sentinel', '--dir', dir], { configFile: file });
    processes.push(sentinel);
    sentinels.push(sentinel);
  }
  for (const sentinel of sentinels) {
    await until(`sentinel ${sentinel.port} ready`, async () => {
      const info = (await sentinelCli(sentinel.port, 'sentinel', 'master', MASTER_NAME)).split('\n');
      const value = (key: string) => info[info.indexOf(key) + 1];
      return value('num-slaves') === '1' && value('num-other-sentinels') === '2';
    });
  }
  const masterPort = async (): Promise<number> => {
    for (const sentinel of sentinels) {
      const reply = await sentinelCli(sentinel.port, 'sentinel', 'get-master-addr-by-name', MASTER_NAME).catch(() => '');
      const port = Number(reply.split('\n')[1]);
      if (Number.isInteger(port) && port > 0) return port;
    }
    throw new Error('no sentinel answers');
  };
  return { master, replica, sentinels, addresses: sentinels.map((s) => `127.0.0.1:${s.port}`), masterPort, cli };
}
