import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { promisify } from 'node:util';
import { onCleanup } from './cleanup.js';
import { startRedis, type TestRedis, type TestTlsFiles } from './redis-server.js';

const run = promisify(execFile);

/** The redis-cli binary: `REDIS_CLI`, else the one on PATH (it comes with redis-server). */
const CLI = process.env.REDIS_CLI ?? 'redis-cli';

export interface TestRedisCluster {
  /** Masters first (in slot order), then replicas. */
  readonly nodes: readonly TestRedis[];
  /** Seed URLs, one per master, as `cache.redis.cluster` takes them (with the password, if any). */
  readonly urls: readonly string[];
  /** redis-cli against one node (no cluster redirection): its trimmed output. */
  cli(port: number, ...args: string[]): Promise<string>;
}

export interface TestRedisClusterOptions {
  readonly masters?: number;
  /** Replicas per master. Default 0. */
  readonly replicas?: number;
  /** `requirepass` (and `masterauth`) on every node. */
  readonly password?: string;
  /** TLS only, for clients and the cluster bus alike. */
  readonly tls?: TestTlsFiles;
  /** Default 20 s. */
  readonly timeoutMs?: number;
  /** `cluster-node-timeout`: how soon a dead master's replica takes over. Default Redis's 15 s. */
  readonly nodeTimeoutMs?: number;
}

/**
 * A real Redis Cluster for one test (3 masters, no replicas unless asked): redis-server processes
 * on free ports, their cluster config files in a temporary directory, joined with `redis-cli
 * --cluster create`. `cluster-require-full-coverage no`, as docs/redis.md advises: the nodes that
 * are up keep serving their slots while one is down. Resolves once every node reports
 * `cluster_state:ok`; when the test ends, every node is killed and the directory removed.
 */
export async function startRedisCluster(t: TestContext, options: TestRedisClusterOptions = {}): Promise<TestRedisCluster> {
  const { masters = 3, replicas = 0, password, tls, timeoutMs = 20_000, nodeTimeoutMs } = options;
  const dir = await mkdtemp(join(tmpdir(), 'perch-cluster-'));
  const nodes: TestRedis[] = [];
  onCleanup(t, async () => {
    await Promise.all(nodes.map((node) => node.kill()));
    await rm(dir, { recursive: true, force: true });
  });
  const auth = password === undefined ? [] : ['--requirepass', password, '--masterauth', password];
  const bus = tls === undefined ? [] : ['--tls-cluster', 'yes', '--tls-replication', 'yes'];
  const failover = nodeTimeoutMs === undefined ? [] : ['--cluster-node-timeout', String(nodeTimeoutMs)];
  for (let i = 0; i < masters * (1 + replicas); i++) {
    const args = ['--cluster-enabled', 'yes', '--cluster-config-file', join(dir, `nodes-${i}.conf`), '--dir', dir, '--cluster-require-full-coverage', 'no', ...auth, ...bus, ...failover];
    nodes.push(await startRedis(t, args, tls === undefined ? {} : { tls }));
  }
  const cliAuth = [...(password === undefined ? [] : ['-a', password, '--no-auth-warning']), ...(tls === undefined ? [] : ['--tls', '--cacert', tls.cert])];
  const cli = async (port: number, ...args: string[]): Promise<string> =>
    (await run(CLI, ['-h', '127.0.0.1', '-p', String(port), ...cliAuth, ...args], { timeout: timeoutMs })).stdout.trim();

  // redis-cli makes the first `masters` nodes the masters, in slot order, and the rest replicas.
  await run(
    CLI,
    [...cliAuth, '--cluster', 'create', ...nodes.map((node) => `127.0.0.1:${node.port}`), '--cluster-replicas', String(replicas), '--cluster-yes'],
    { timeout: timeoutMs },
  );
  const deadline = Date.now() + timeoutMs;
  for (const node of nodes) {
    while (!(await cli(node.port, 'cluster', 'info')).includes('cluster_state:ok')) {
      if (Date.now() > deadline) throw new Error(`cluster not ok on port ${node.port} in time`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
  const userinfo = password === undefined ? '' : `:${encodeURIComponent(password)}@`;
  const urls = nodes.slice(0, masters).map((node) => node.url.replace('://', `://${userinfo}`));
  return { nodes, urls, cli };
}
