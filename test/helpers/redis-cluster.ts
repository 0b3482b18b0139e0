import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { promisify } from 'node:util';
import { startRedis, type TestRedis } from './redis-server.js';

const run = promisify(execFile);

/** The redis-cli binary: `REDIS_CLI`, else the one on PATH (it comes with redis-server). */
const CLI = process.env.REDIS_CLI ?? 'redis-cli';

export interface TestRedisCluster {
  readonly nodes: readonly TestRedis[];
  /** Seed URLs, one per node, as `cache.redis.cluster` takes them. */
  readonly urls: readonly string[];
  /** redis-cli against one node (no cluster redirection): its trimmed output. */
  cli(port: number, ...args: string[]): Promise<string>;
}

/**
 * A real 3-master Redis Cluster (no replicas) for one test: three redis-server processes on free
 * ports, their cluster config files in a temporary directory, joined with `redis-cli --cluster
 * create`. Resolves once every node reports `cluster_state:ok`; when the test ends, every node
 * is killed and the directory removed.
 */
export async function startRedisCluster(t: TestContext, size = 3, timeoutMs = 20_000): Promise<TestRedisCluster> {
  const dir = await mkdtemp(join(tmpdir(), 'perch-cluster-'));
  const nodes: TestRedis[] = [];
  t.after(async () => {
    await Promise.all(nodes.map((node) => node.kill()));
    await rm(dir, { recursive: true, force: true });
  });
  for (let i = 0; i < size; i++) {
    nodes.push(
      await startRedis(t, ['--cluster-enabled', 'yes', '--cluster-config-file', join(dir, `nodes-${i}.conf`), '--dir', dir]),
    );
  }
  const cli = async (port: number, ...args: string[]): Promise<string> =>
    (await run(CLI, ['-h', '127.0.0.1', '-p', String(port), ...args], { timeout: timeoutMs })).stdout.trim();

  await run(
    CLI,
    ['--cluster', 'create', ...nodes.map((node) => `127.0.0.1:${node.port}`), '--cluster-replicas', '0', '--cluster-yes'],
    { timeout: timeoutMs },
  );
  const deadline = Date.now() + timeoutMs;
  for (const node of nodes) {
    while (!(await cli(node.port, 'cluster', 'info')).includes('cluster_state:ok')) {
      if (Date.now() > deadline) throw new Error(`cluster not ok on port ${node.port} in time`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
  return { nodes, urls: nodes.map((node) => node.url), cli };
}
