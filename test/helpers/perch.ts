import type { TestContext } from 'node:test';
import type { Dispatcher } from 'undici';
import type { TieredCache } from '../../src/cache/tiered-cache.js';
import type { Clock } from '../../src/clock.js';
import { parseConfig } from '../../src/config/load.js';
import type { Config } from '../../src/config/types.js';
import type { Timers } from '../../src/timers.js';
import { createPerch } from '../../src/app/perch.js';
import { onCleanup } from './cleanup.js';
import { leakedFragments, secretsOf } from './secret-scan.js';
import { captureLogs, type LogCapture } from './log-capture.js';

export const KEY = 'test-key-alpha-0123456789';
export const OTHER_KEY = 'test-key-bravo-0123456789';

export interface RunningPerch {
  readonly url: string;
  /**
   * Requests perch has started handling. The count is taken after perch's own handler ran
   * synchronously for a request: with the memory tier alone it has then joined the cache or an
   * upstream flight; with Redis it may still be awaiting its Redis lookup.
   */
  received(): number;
  readonly config: Config;
  /** The instance's cache tiers, to read Redis state and counters. */
  readonly cache: TieredCache;
  readonly logs: LogCapture;
  /** GET (or `method`) on perch with the test key unless `key` says otherwise (null: no header). */
  request(path: string, options?: RequestOptions): Promise<TestResponse>;
  /** Applies `yaml` as a SIGHUP would (`env` as at the start). */
  reload(yaml: string): void;
}

export interface RequestOptions {
  readonly key?: string | null;
  readonly method?: string;
  readonly headers?: Record<string, string>;
}

export interface TestResponse {
  readonly status: number;
  readonly headers: Headers;
  readonly text: string;
  json(): any;
}

/**
 * YAML for a test instance: the two test keys, a generous plan, and `upstreams` as given
 * (YAML text indented under `upstreams:`), plus any further top-level YAML.
 */
export function testConfig(upstreams: string, extra = ''): string {
  return `
server: { host: 127.0.0.1, port: 0 }
auth:
  keys:
    - { id: alpha, key: "${KEY}", plan: big }
    - { id: bravo, key: "${OTHER_KEY}", plan: big }
rate_limits:
  big: { capacity: 100000, refill_per_second: 100000 }
upstreams:
${upstreams
  .trim()
  .split('\n')
  .map((line) => `  ${line}`)
  .join('\n')}
${extra}`;
}

/** A v1 upstream entry for `testConfig`. */
export function v1(name: string, url: string, extra = ''): string {
  const timeout = extra.includes('timeout_ms') ? '' : ', timeout_ms: 2000';
  return `${name}: { kind: v1, url: "${url}"${timeout}${extra === '' ? '' : `, ${extra}`} }`;
}

/** One series of a Prometheus scrape of `perch`, undefined when absent. */
export async function metric(perch: Pick<RunningPerch, 'url'>, series: string): Promise<number | undefined> {
  const text = await (await fetch(`${perch.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/** Polls `condition` every 5 ms until it holds, failing after `timeoutMs`. */
export async function waitFor(condition: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  await pollFor(async () => ((await condition()) ? true : undefined), timeoutMs);
}

/**
 * Polls `probe` every `intervalMs` until it yields a value, and resolves with it; fails after
 * `timeoutMs`. A probe that may throw while the system is in flux catches its own errors.
 */
export async function pollFor<T>(probe: () => T | undefined | Promise<T | undefined>, timeoutMs = 5000, intervalMs = 5): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/**
 * Starts perch from YAML on 127.0.0.1:0, with logs captured; stopped when the test ends. `env`
 * serves `${ENV}` substitution and the `OTEL_*` variables.
 */
export async function startPerch(
  t: TestContext,
  yaml: string,
  options: { clock?: Clock; timers?: Timers; env?: NodeJS.ProcessEnv; dispatchers?: Record<string, Dispatcher>; random?: () => number; traceExportDelayMs?: number; traceExportBatchSize?: number } = {},
): Promise<RunningPerch> {
  const config = parseConfig(yaml, options.env ?? {});
  const logs = captureLogs();
  const perch = createPerch({
    config,
    logger: logs.logger,
    clock: options.clock,
    timers: options.timers,
    dispatchers: options.dispatchers,
    random: options.random,
    env: options.env,
    traceExportDelayMs: options.traceExportDelayMs,
    traceExportBatchSize: options.traceExportBatchSize,
  });
  const address = await perch.listen();
  // Every key configured or presented, every upstream secret: none may reach a log, even in part.
  const secrets = new Set(secretsOf(yaml, options.env ?? {}));
  onCleanup(t, () => {
    const leaks = leakedFragments(logs.text(), secrets);
    if (leaks.length > 0) throw new Error(`secret fragments in the log: ${leaks.join(', ')}`);
  });
  onCleanup(t, () => perch.close());
  const url = `http://127.0.0.1:${address.port}`;
  let received = 0;
  perch.server.on('request', () => received++);
  return {
    url,
    received: () => received,
    config,
    cache: perch.cache,
    logs,
    reload(next) {
      perch.reload(parseConfig(next, options.env ?? {}));
    },
    async request(path, requestOptions = {}) {
      const headers: Record<string, string> = { ...requestOptions.headers };
      const key = requestOptions.key === undefined ? KEY : requestOptions.key;
      if (key !== null) headers['x-api-key'] = key;
      const presented = headers['x-api-key'];
      if (presented !== undefined) secrets.add(presented);
      const response = await fetch(url + path, { method: requestOptions.method ?? 'GET', headers });
      const text = await response.text();
      // A miss is answered before its entry reaches Redis: tests go on once it has, as a client
      // that comes back later would find it.
      await perch.cache.settled();
      return { status: response.status, headers: response.headers, text, json: () => JSON.parse(text) };
    },
  };
}
