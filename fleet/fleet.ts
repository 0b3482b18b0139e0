import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { startRedis, type TestRedis } from '../test/helpers/redis-server.js';
import { startTcpProxy, type TcpProxy } from '../test/helpers/tcp-proxy.js';
import { freePort } from '../test/helpers/perch-process.js';
import type { Caps, HistoryWriter, MetricsEvent, Plan, RunEvent } from './history.js';
import type { Prng } from './prng.js';

/** The test helpers clean up through a TestContext's `after`; the fleet runs its steps itself. */
export class Teardown {
  readonly #steps: (() => unknown)[] = [];
  readonly context = { after: (fn: () => unknown) => this.#steps.push(fn) } as unknown as TestContext;

  /** Runs the steps last registered first, so instances stop before the Redis they use. */
  async run(): Promise<void> {
    for (const step of this.#steps.splice(0).reverse()) await step();
  }
}

export const ADMIN_KEY = 'fleet-admin-key-0123456789';
export const X_TOKEN = 'fleet-x-token-0123456789';
/** Secrets of the configured client keys, by key id. */
export const SECRETS: Readonly<Record<string, string>> = {
  steady: 'fleet-key-steady-0123456789',
  flood: 'fleet-key-flood-0123456789',
  budget: 'fleet-key-budget-0123456789',
  mid: 'fleet-key-mid-0123456789',
  /** Configured only while a SIGHUP has added it (plan `mid`): a key added and removed. */
  extra: 'fleet-key-extra-0123456789',
};

export interface FleetShape {
  readonly run: RunEvent;
  readonly batchWindowMs: number;
  readonly queueTimeoutMs: number;
  readonly verifyTtl: number;
}

/** Draws a fleet's configuration from the seed: caps, plans, TTLs, batching, pass-through. */
export function drawShape(prng: Prng, seed: number, instances: number, perch: string): FleetShape {
  const passThrough = prng.chance(0.25);
  const batch = !passThrough && prng.chance(0.5);
  const rate = prng.pick([2, 3, 5, 8]);
  const caps: Caps = {
    rate,
    maxConcurrent: prng.pick([2, 4, 8]),
    // In pass-through every made-up key costs a verifying call: a quota they can spend would hide the rest.
    quota: { requests: rate * prng.int(4, 12) * (passThrough ? 20 : 1), perSeconds: prng.pick([10, 20, 30]) },
    downShare: Math.round((1 / instances) * 1000) / 1000,
  };
  const xRate = prng.pick([2, 5]);
  const xCaps: Caps = { rate: xRate, maxConcurrent: prng.pick([2, 4]), quota: { requests: 100_000, perSeconds: 900 }, downShare: caps.downShare };
  const plans: Record<string, Plan> = passThrough
    ? { resale: { capacity: prng.pick([5, 10, 15]), refill: prng.pick([2, 5]) } }
    : {
        steady: prng.chance(0.5) ? { capacity: prng.pick([200, 500, 1000]), refill: prng.pick([20, 50]) } : { capacity: prng.pick([10, 15]), refill: prng.pick([3, 5]) },
        flood: { capacity: prng.pick([5, 10]), refill: prng.pick([1, 2, 5]) },
        budget: { capacity: 50, refill: 10, budget: prng.int(3, 10) },
        mid: { capacity: prng.pick([20, 40]), refill: prng.pick([5, 10]) },
      };
  const keys: Record<string, string> = passThrough ? { steady: 'resale', mid: 'resale' } : { steady: 'steady', flood: 'flood', budget: 'budget', mid: 'mid' };
  const run: RunEvent = {
    t: 'run',
    seed,
    instances,
    workers: prng.chance(1 / 3) ? 2 : 0,
    perch,
    passThrough,
    batch,
    caps,
    ...(batch ? { xCaps } : {}),
    plans,
    keys,
    ttl: prng.pick([0, 1, 2, 5, 30]),
    staleSeconds: prng.pick([0, 2, 10]),
    missDeadlineMs: prng.pick([2000, 4000]),
    graceMs: prng.pick([1000, 2000]),
    budgetPrefix: '/v1/users/77',
  };
  // Short queue timeouts beside batch windows: where waiting for company meets the queue bound.
  const batchWindowMs = prng.pick([0, 5, 20, 50]);
  const queueTimeoutMs = prng.pick([0, 10, 200, 1000]);
  const verifyTtl = prng.pick([2, 3, 5]);
  return { run: { ...run, verifyTtl }, batchWindowMs, queueTimeoutMs, verifyTtl };
}

/** What a SIGHUP may change beyond caps and TTL, and the instance's metrics port. */
export interface ConfigMore {
  readonly plans?: Readonly<Record<string, Plan>>;
  readonly keys?: Readonly<Record<string, string>>;
  readonly metricsPort?: number;
}

/** One instance's YAML, with `caps`, `ttl`, plans and keys as a SIGHUP may have changed them. */
export function configYaml(shape: FleetShape, port: number, redisUrl: string, providerUrl: string, xUrl: string | undefined, caps: Caps, ttl: number, more: ConfigMore = {}): string {
  const run = { ...shape.run, plans: more.plans ?? shape.run.plans, keys: more.keys ?? shape.run.keys };
  const ttls = ['user', 'user_by_username', 'tweets', 'replies', 'following', 'tweet', 'not_found'].map((e) => `${e}: ${ttl}`).join(', ');
  const limits = (c: Caps) =>
    `max_requests_per_second: ${c.rate}, max_concurrent: ${c.maxConcurrent}, quota: { requests: ${c.quota.requests}, per_seconds: ${c.quota.perSeconds} }, redis_down_share: ${c.downShare}, queue_timeout_ms: ${shape.queueTimeoutMs}, timeout_ms: 1500`;
  const auth = run.passThrough
    ? `auth: { mode: upstream, default_plan: resale, verify_ttl_seconds: ${shape.verifyTtl}, verify_burst: 3, verify_rate_per_second: 1 }`
    : `auth:\n  keys:\n${Object.entries(run.keys)
        .map(([id, plan]) => `    - { id: ${id}, key: "${SECRETS[id]}", plan: ${plan} }`)
        .join('\n')}`;
  const plans = Object.entries(run.plans)
    .map(([name, p]) => `  ${name}: { capacity: ${p.capacity}, refill_per_second: ${p.refill}${p.budget === undefined ? '' : `, provider_calls: { limit: ${p.budget}, window: day }`} }`)
    .join('\n');
  const credentials = run.passThrough ? '' : `, credentials: [{ id: c1, headers: { X-API-Key: cred-c1 } }, { id: c2, headers: { X-API-Key: cred-c2 } }]`;
  const x =
    xUrl === undefined || run.xCaps === undefined
      ? ''
      : `\n  x: { kind: x_v2, url: "${xUrl}", bearer_token: "${X_TOKEN}", batch: { enabled: true, window_ms: ${shape.batchWindowMs} }, ${limits(run.xCaps)} }\nroutes: { user: [x], user_by_username: [x], tweet: [x], tweets: [main], replies: [main], following: [main] }`;
  return `server: { host: 127.0.0.1, port: ${port}, shutdown_grace_ms: ${run.graceMs}, miss_deadline_ms: ${run.missDeadlineMs} }
${auth}
rate_limits:
${plans}
admin:
  keys:
    - { id: ops, key: "${ADMIN_KEY}" }
upstreams:
  main: { kind: v1, url: "${providerUrl}"${credentials}, ${limits(caps)} }${x}
cache:
  memory: { max_bytes: 16777216 }
  redis: { url: "${redisUrl}", command_timeout_ms: ${REDIS_TIMEOUT_MS} }
  ttl_seconds: { ${ttls} }
  stale_seconds: ${run.staleSeconds}
log: { level: info }
${more.metricsPort === undefined ? '' : `metrics: { port: ${more.metricsPort} }\n`}`;
}

/** The provider guard's switch lines (insured-state.ts), as perch logs them. */
const GUARD_DOWN = 'provider guard: Redis failed';
const GUARD_UP = 'provider guard: Redis answers again';

/**
 * Redis's command timeout in the fleet: the default 50 ms is missed on a loaded 2-core machine
 * with no fault injected (a 64-wide burst opened every instance's breaker in most seeds), and the
 * documented bounds across an outage are loose enough to hide a double handout. Frozen or cut
 * off, Redis still times out at once on this scale.
 */
const REDIS_TIMEOUT_MS = 300;

/** One perch instance: its relay to Redis, its port, its current process. */
export class Instance {
  gen = 0;
  child: ChildProcess | undefined;
  url: string;
  #stdout = '';
  #stderr = '';
  #exited: Promise<void> = Promise.resolve();
  #signal: { name: string; at: number } | undefined;
  #ready = false;
  /** Its metrics listener's port (worker k on metricsPort + k - 1); 0: none. */
  metricsPort = 0;
  /** Wall-clock seconds when the current process was seen up: a worker started later has restarted. */
  #upWall = 0;

  constructor(
    readonly index: number,
    readonly port: number,
    readonly relay: TcpProxy,
    readonly configPath: string,
    readonly main: string,
    readonly workers: number,
    readonly history: HistoryWriter,
    readonly now: () => number,
  ) {
    this.url = `http://127.0.0.1:${port}`;
  }

  get up(): boolean {
    return this.#ready && this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null && this.#signal === undefined;
  }

  async start(): Promise<void> {
    this.gen++;
    const gen = this.gen;
    this.#stdout = '';
    this.#stderr = '';
    this.#signal = undefined;
    this.#ready = false;
    const args = [this.main, '--config', this.configPath, ...(this.workers > 0 ? ['--workers', String(this.workers)] : [])];
    const child = spawn(process.execPath, args, { env: { PATH: process.env.PATH }, stdio: ['ignore', 'pipe', 'pipe'] });
    this.child = child;
    child.stdout!.on('data', (d: Buffer) => (this.#stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (this.#stderr += d.toString()));
    this.#exited = new Promise((resolve) =>
      child.on('exit', (code, signal) => {
        const sent = this.#signal;
        this.history.add({ t: 'proc', inst: this.index, gen, kind: 'exit', at: this.now(), code, signal, ...(sent === undefined ? {} : { sentSignal: sent.name, signalAt: sent.at }) });
        this.#recordStdout(gen, sent?.name !== 'SIGKILL');
        resolve();
      }),
    );
    const deadline = Date.now() + 30_000;
    while (!/perch is up on/.test(this.#stderr) && child.exitCode === null && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    if (!/perch is up on/.test(this.#stderr)) throw new Error(`instance ${this.index} did not start:\n${this.#stderr}${this.#stdout}`.slice(0, 4000));
    this.history.add({ t: 'proc', inst: this.index, gen, kind: 'start', at: this.now() });
    this.#upWall = Date.now() / 1000;
    this.#ready = true;
  }

  #recordStdout(gen: number, clean: boolean): void {
    // Kept beside the history, so that a failing seed can be read from perch's own lines.
    writeFileSync(this.configPath.replace(/\.yaml$/, `-gen${gen}.log`), this.#stdout);
    const lines = this.#stdout.split('\n');
    // A process killed mid-write may leave a partial last line: only whole lines are judged then.
    const last = lines.pop() ?? '';
    if (clean && last !== '') lines.push(last);
    const badLines: string[] = [];
    const accessIds: string[] = [];
    // Redis away from this instance's guard though no fault was made (its answers late on a busy
    // machine, its connection not ready yet at start): perch's own switch lines say when.
    const zero = Date.now() - this.now();
    let downSince: number | undefined;
    const guardDown = (until: number) => {
      if (downSince !== undefined) this.history.add({ t: 'fault', kind: 'guard-down', at: downSince, until, inst: this.index, detail: 'from perch\'s log' });
      downSince = undefined;
    };
    const seen = new RedisSeen(zero);
    for (const line of lines) {
      if (line === '') continue;
      try {
        const entry = JSON.parse(line) as LogEntry;
        if (entry.msg === 'request' && entry.req_id !== undefined) accessIds.push(entry.req_id);
        else if (entry.msg?.startsWith(GUARD_DOWN) === true && entry.time !== undefined) downSince ??= entry.time - zero;
        else if (entry.msg?.startsWith(GUARD_UP) === true && entry.time !== undefined) guardDown(entry.time - zero);
        seen.add(entry);
      } catch {
        badLines.push(line);
      }
    }
    guardDown(this.now());
    for (const [at, until] of seen.windows(this.now())) this.history.add({ t: 'fault', kind: 'redis-seen', at, until, inst: this.index });
    this.history.add({ t: 'stdout', inst: this.index, gen, clean, badLines, accessIds });
  }

  /** Sends `signal` and waits for the exit (SIGKILL after 15 s, so a run always ends). */
  async stop(signal: 'SIGTERM' | 'SIGKILL'): Promise<void> {
    const child = this.child;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
    this.#signal = { name: signal, at: this.now() };
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    await this.#exited;
    clearTimeout(timer);
  }

  hup(): void {
    this.child?.kill('SIGHUP');
  }

  /** The running process's counters, summed over its workers, recorded as a `metrics` event. */
  async scrape(): Promise<void> {
    if (!this.up || this.metricsPort === 0) return;
    const ports = Array.from({ length: Math.max(1, this.workers) }, (_, k) => this.metricsPort + k);
    const requests: Record<string, number> = {};
    const calls: Record<string, number> = {};
    const keyCalls: Record<string, Record<string, number>> = {};
    let whole = true;
    const add = (into: Record<string, number>, label: string, value: number) => (into[label] = (into[label] ?? 0) + value);
    for (const port of ports) {
      const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      for (const { name, labels, value } of samples(text)) {
        if (name === 'perch_requests_total') add(requests, labels['status']!, value);
        else if (name === 'perch_upstream_requests_total') add(calls, labels['upstream']!, value);
        else if (name === 'perch_upstream_retries_total' && labels['decision'] === 'retried') add(calls, labels['upstream']!, value);
        else if (name === 'perch_key_upstream_calls_total') add((keyCalls[labels['key_id']!] ??= {}), labels['upstream']!, value);
        // A worker started again after a death counts from zero: its process is younger than the instance.
        else if (name === 'process_start_time_seconds' && value > this.#upWall + 1) whole = false;
      }
    }
    const event: MetricsEvent = { t: 'metrics', inst: this.index, gen: this.gen, at: this.now(), requests, calls, keyCalls, whole };
    this.history.add(event);
  }
}

/** The samples of a Prometheus text exposition (no escapes in the label values perch writes here). */
export function samples(text: string): { name: string; labels: Record<string, string>; value: number }[] {
  const out: { name: string; labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (m === null) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** A port whose next `count - 1` ports are free too (a worker k serves metrics on port + k - 1). */
async function freePorts(count: number): Promise<number> {
  for (;;) {
    const port = await freePort();
    const free = await Promise.all(Array.from({ length: count - 1 }, (_, k) => isFree(port + k + 1)));
    if (free.every(Boolean)) return port;
  }
}

function isFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

interface LogEntry {
  msg?: string;
  req_id?: string;
  time?: number;
  dependency?: string;
}

/**
 * When a perch process's token buckets answered from memory, from its own log: a loaded machine
 * makes Redis miss `command_timeout_ms` with no fault injected (seed 5: both instances' breakers
 * opened in a burst of 64 at a time, and their memory buckets answered for 1.4 s). What perch
 * promises across an outage applies then too. The buckets fall back while their switch says so
 * ("rate limits: Redis failed" until "answers again") and while a Redis node's breaker is open
 * (it is shared by everything on that node); a second before each for the command timeout that
 * came first. Merged into windows on the fleet's clock (`offset`: the log's epoch ms less it).
 */
class RedisSeen {
  readonly #offset: number;
  readonly #spans: [number, number][] = [];
  /** Since when each switch or breaker has been open, by what it is. */
  readonly #open = new Map<string, number>();

  constructor(offset: number) {
    this.#offset = offset;
  }

  add(entry: LogEntry): void {
    if (entry.time === undefined) return;
    const at = entry.time - this.#offset;
    const { msg = '', dependency = '' } = entry;
    if (msg.startsWith('rate limits: Redis failed')) this.#begin('rate limits', at);
    else if (msg.startsWith('rate limits: Redis answers again')) this.#end('rate limits', at);
    else if (msg === 'circuit breaker open: skipping dependency' && /redis/i.test(dependency)) this.#begin(dependency, at);
    else if (msg === 'circuit breaker closed: dependency is back') this.#end(dependency, at);
  }

  #begin(what: string, at: number): void {
    if (!this.#open.has(what)) this.#open.set(what, at - 1000);
  }

  #end(what: string, at: number): void {
    const from = this.#open.get(what);
    if (from === undefined) return;
    this.#spans.push([from, at]);
    this.#open.delete(what);
  }

  /** The spans, those still open running to `end` (the process's), merged where they touch. */
  windows(end: number): [number, number][] {
    const spans = [...this.#spans, ...[...this.#open.values()].map((from): [number, number] => [from, end])].sort((a, b) => a[0] - b[0]);
    const merged: [number, number][] = [];
    for (const [from, until] of spans) {
      const last = merged[merged.length - 1];
      if (last !== undefined && from <= last[1]) last[1] = Math.max(last[1], until);
      else merged.push([from, until]);
    }
    return merged;
  }
}

export interface Fleet {
  readonly redis: TestRedis;
  readonly instances: readonly Instance[];
  /** Redis's `dir`, where SAVE writes the dump a restart with its data loads. */
  readonly redisDir: string;
  /** The plans and keys of the config files now (a SIGHUP's rewrite changes them). */
  readonly plans: Readonly<Record<string, Plan>>;
  readonly keys: Readonly<Record<string, string>>;
  /** Rewrites every instance's config with `caps`, `ttl`, and plans and keys if given (for a SIGHUP). */
  rewrite(caps: Caps, ttl: number, more?: { plans?: Readonly<Record<string, Plan>>; keys?: Readonly<Record<string, string>> }): void;
}

export async function startFleet(teardown: Teardown, shape: FleetShape, dir: string, perchDir: string, providerUrl: string, xUrl: string | undefined, history: HistoryWriter, now: () => number): Promise<Fleet> {
  const t = teardown.context;
  const redisDir = join(dir, 'redis');
  mkdirSync(redisDir, { recursive: true });
  const redis = await startRedis(t, ['--dir', redisDir]);
  t.after(() => rmSync(redisDir, { recursive: true, force: true }));
  const main = join(perchDir, 'dist', 'src', 'main.js');
  const instances: Instance[] = [];
  const yaml = (inst: Instance, caps: Caps, ttl: number, plans: Readonly<Record<string, Plan>>, keys: Readonly<Record<string, string>>) =>
    configYaml(shape, inst.port, inst.relay.url, providerUrl, xUrl, caps, ttl, { plans, keys, metricsPort: inst.metricsPort });
  for (let i = 0; i < shape.run.instances; i++) {
    const relay = await startTcpProxy(t, redis.port);
    const port = await freePort();
    const path = join(dir, `perch-${i}.yaml`);
    const inst = new Instance(i, port, relay, path, main, i === 0 ? shape.run.workers : 0, history, now);
    inst.metricsPort = await freePorts(Math.max(1, inst.workers));
    writeFileSync(path, yaml(inst, shape.run.caps, shape.run.ttl, shape.run.plans, shape.run.keys));
    instances.push(inst);
  }
  t.after(() => Promise.all(instances.map((inst) => inst.stop('SIGKILL'))));
  await Promise.all(instances.map((inst) => inst.start()));
  const fleet: Fleet = {
    redis,
    instances,
    redisDir,
    plans: shape.run.plans,
    keys: shape.run.keys,
    rewrite: (caps, ttl, more = {}) => {
      const plans = more.plans ?? fleet.plans;
      const keys = more.keys ?? fleet.keys;
      Object.assign(fleet, { plans, keys });
      for (const inst of instances) writeFileSync(inst.configPath, yaml(inst, caps, ttl, plans, keys));
    },
  };
  return fleet;
}
