import type { Fleet, FleetShape, Instance } from './fleet.js';
import { ADMIN_KEY, SECRETS } from './fleet.js';
import { rmSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import type { Caps, HistoryWriter, Plan } from './history.js';
import type { Prng } from './prng.js';
import { versionOf, type Provider, type XProvider } from './provider.js';

export interface Run {
  readonly shape: FleetShape;
  readonly fleet: Fleet;
  readonly provider: Provider;
  readonly x: XProvider | undefined;
  readonly history: HistoryWriter;
  readonly now: () => number;
  /** Run time in ms: actors stop starting operations past it. */
  readonly endsAt: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const HOT = 8;
const COLD = 60;

/** A path of one of the six endpoints: hot ids (often cached) or cold ones. */
function drawPath(prng: Prng): string {
  const id = prng.chance(0.7) ? prng.int(1, HOT) : prng.int(HOT + 1, COLD);
  switch (prng.int(0, 7)) {
    case 0:
    case 1:
      return `/v1/users/${id}`;
    case 2:
      return `/v1/users/by/username/name${id}`;
    case 3:
      return `/v1/users/${id}/tweets${prng.chance(0.3) ? '?cursor=b' : ''}`;
    case 4:
      return `/v1/users/${id}/replies`;
    case 5:
      return `/v1/users/${id}/following${prng.chance(0.3) ? '?count=5' : ''}`;
    default:
      return `/v1/tweets/${1000 + id}`;
  }
}

let nextRequest = 0;

interface Held {
  readonly etag?: string;
  readonly lastModified?: string;
  readonly version?: number;
}

/** One client: sends and records; remembers validators per path to send them back. */
class Client {
  readonly #held = new Map<string, Held>();

  constructor(
    readonly run: Run,
    readonly prng: Prng,
    readonly keyId: string,
    readonly secret: () => string,
  ) {}

  pickInstance(): Instance | undefined {
    const up = this.run.fleet.instances.filter((i) => i.up);
    return up.length === 0 ? undefined : this.prng.pick(up);
  }

  async get(path: string): Promise<void> {
    const inst = this.pickInstance();
    if (inst === undefined) return;
    const { prng, run } = this;
    const id = `f${run.shape.run.seed}-${++nextRequest}`;
    const headers: Record<string, string> = { 'x-api-key': this.secret(), 'x-request-id': id, 'accept-encoding': prng.pick(['gzip', 'br', 'identity', 'gzip, br']) };
    const held = this.#held.get(path);
    let validator: 'inm' | 'ims' | undefined;
    if (held !== undefined && held.etag !== undefined && prng.chance(0.25)) {
      headers['if-none-match'] = held.etag;
      validator = 'inm';
    } else if (held?.lastModified !== undefined && prng.chance(0.1)) {
      headers['if-modified-since'] = held.lastModified;
      validator = 'ims';
    }
    const abort = new AbortController();
    const disconnect = prng.chance(0.03) ? setTimeout(() => abort.abort(), prng.int(10, 200)) : undefined;
    const sent = run.now();
    const gen = inst.gen;
    const base = { t: 'req' as const, id, inst: inst.index, gen, key: this.keyId, path, sent, ...(validator === undefined ? {} : { validator, validatorVersion: held!.version! }) };
    try {
      const res = await fetch(`${inst.url}${path}`, { headers, signal: abort.signal });
      const text = await res.text();
      const done = run.now();
      const version = res.status === 200 ? versionOf(text) : undefined;
      const etag = res.headers.get('etag') ?? undefined;
      const lastModified = res.headers.get('last-modified') ?? undefined;
      const cache = res.headers.get('cache-status') ?? undefined;
      const ratelimit = res.headers.get('ratelimit') ?? undefined;
      if (res.status === 200) this.#held.set(path, { ...(etag === undefined ? {} : { etag }), ...(lastModified === undefined ? {} : { lastModified }), ...(version === undefined ? {} : { version }) });
      run.history.add({ ...base, done, status: res.status, ...(version === undefined ? {} : { version }), ...(etag === undefined ? {} : { etag }), ...(lastModified === undefined ? {} : { lastModified }), ...(cache === undefined ? {} : { cache }), ...(ratelimit === undefined ? {} : { ratelimit }) });
    } catch (error) {
      const aborted = abort.signal.aborted;
      run.history.add({ ...base, done: run.now(), status: aborted ? -1 : 0, error: aborted ? 'client disconnected' : String((error as Error).cause ?? error).slice(0, 120) });
    } finally {
      clearTimeout(disconnect);
    }
  }
}

/** Sends at `perSecond` until the end, each request from `path`. */
async function steadyLoop(client: Client, perSecond: () => number, path: () => string, until = client.run.endsAt): Promise<void> {
  const { run } = client;
  const pending = new Set<Promise<void>>();
  while (run.now() < until) {
    const p = client.get(path());
    pending.add(p);
    void p.finally(() => pending.delete(p));
    await sleep(1000 / perSecond());
  }
  await Promise.all(pending);
}

/** `count` requests, `concurrency` at a time. */
async function burst(client: Client, count: number, concurrency: number, path: () => string): Promise<void> {
  let left = count;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (left-- > 0 && client.run.now() < client.run.endsAt + 2000) await client.get(path());
    }),
  );
}

export async function workload(run: Run, prng: Prng): Promise<void> {
  const { shape } = run;
  const actors: Promise<void>[] = [];
  const hotOrCold = (p: Prng) => () => drawPath(p);
  let reader: Client;
  if (shape.run.passThrough) {
    const genuine = ['steady', 'mid'].map((id) => {
      const secret = `fleet-genuine-${id}-${prng.int(1e6, 9e6)}`;
      run.provider.genuine.add(secret);
      return new Client(run, prng.fork(), id, () => secret);
    });
    const plan = shape.run.plans['resale']!;
    for (const c of genuine) actors.push(steadyLoop(c, () => plan.refill * 0.5, hotOrCold(c.prng)));
    reader = new Client(run, prng.fork(), 'mid', genuine[1]!.secret);
    // Made-up keys flood: each request a new key, on cached paths and on ids perch answers itself.
    const madeup: Client = new Client(run, prng.fork(), 'madeup', () => `madeup-key-${madeup.prng.int(1e9, 9e9)}`);
    actors.push(steadyLoop(madeup, () => 20, () => (madeup.prng.chance(0.5) ? '/v1/users/12345678901234567890' : drawPath(madeup.prng))));
  } else {
    const clients = Object.fromEntries(Object.keys(shape.run.keys).map((id) => [id, new Client(run, prng.fork(), id, () => SECRETS[id]!)]));
    reader = new Client(run, prng.fork(), 'mid', () => SECRETS['mid']!);
    const steady = shape.run.plans['steady']!;
    // Under its plan: 60% of the refill, then, once, a burst of the bucket and up to as much again, 64 at a time.
    const c = clients['steady']!;
    actors.push(
      (async () => {
        const burstAt = run.endsAt * (0.5 + c.prng.next() * 0.3);
        const total = Math.min(steady.refill * 0.6, 30);
        const paths = hotOrCold(c.prng);
        await steadyLoop(c, () => total, paths, burstAt);
        await burst(c, steady.capacity + Math.min(steady.capacity, 200), 64, paths);
        await steadyLoop(c, () => total, paths);
      })(),
    );
    const flood = shape.run.plans['flood']!;
    actors.push(steadyLoop(clients['flood']!, () => flood.refill * 4, hotOrCold(clients['flood']!.prng)));
    const b = clients['budget']!;
    actors.push(steadyLoop(b, () => 3, () => `/v1/users/77${b.prng.int(100, 999)}`));
    const mid = clients['mid']!;
    actors.push(steadyLoop(mid, () => mid.prng.int(2, 12), hotOrCold(mid.prng)));
    const madeup: Client = new Client(run, prng.fork(), 'madeup', () => `madeup-key-${madeup.prng.int(1e9, 9e9)}`);
    actors.push(steadyLoop(madeup, () => 3, hotOrCold(madeup.prng)));
    // A key a SIGHUP adds and a later one removes: refused 401 while it is not configured.
    const extra = new Client(run, prng.fork(), 'extra', () => SECRETS['extra']!);
    actors.push(steadyLoop(extra, () => 1, hotOrCold(extra.prng)));
  }
  actors.push(purger(run, prng.fork(), reader), changer(run, prng.fork()), nemesis(run, prng.fork()));
  await Promise.all(actors);
}

/** The provider's data changes: a hot resource's next answer carries a new version. */
async function changer(run: Run, prng: Prng): Promise<void> {
  while (run.now() < run.endsAt) {
    await sleep(prng.int(100, 800));
    const path = drawPath(prng).split('?')[0]!;
    run.provider.change(path);
  }
}

const SCOPES = [
  (id: number) => ({ body: { endpoint: 'user', user_id: String(id) }, scope: `/v1/users/${id}` }),
  (id: number) => ({ body: { endpoint: 'tweets', user_id: String(id) }, scope: `/v1/users/${id}/tweets` }),
  (id: number) => ({ body: { endpoint: 'replies', user_id: String(id) }, scope: `/v1/users/${id}/replies` }),
  (id: number) => ({ body: { endpoint: 'following', user_id: String(id) }, scope: `/v1/users/${id}/following` }),
  (id: number) => ({ body: { endpoint: 'user_by_username', username: `name${id}` }, scope: `/v1/users/by/username/name${id}` }),
  (id: number) => ({ body: { endpoint: 'tweet', tweet_id: String(1000 + id) }, scope: `/v1/tweets/${1000 + id}` }),
  () => ({ body: { all: true }, scope: '*' }),
];

/**
 * Admin purges of every scope, of hot resources, each after a change of the data; half the time
 * with a read of the resource in flight when the purge is sent, and a read right after it, as an
 * operator checking the purge would.
 */
async function purger(run: Run, prng: Prng, reader: Client): Promise<void> {
  while (run.now() < run.endsAt) {
    await sleep(prng.int(300, 2000));
    const up = run.fleet.instances.filter((i) => i.up);
    if (up.length === 0) continue;
    const inst = prng.pick(up);
    const { body, scope } = prng.pick(SCOPES)(prng.int(1, HOT));
    const check = scope !== '*' && prng.chance(0.5);
    const inFlight = check ? reader.get(scope) : undefined;
    if (check) await sleep(prng.int(5, 100));
    // The data changes first, as an operator purges after a change.
    if (scope !== '*') run.provider.change(scope);
    const sent = run.now();
    let status = 0;
    try {
      const res = await fetch(`${inst.url}/admin/purge`, { method: 'POST', headers: { 'x-api-key': ADMIN_KEY, 'content-type': 'application/json' }, body: JSON.stringify(body) });
      await res.text();
      status = res.status;
    } catch {
      status = 0;
    }
    run.history.add({ t: 'purge', inst: inst.index, scope, sent, done: run.now(), status });
    if (check) await Promise.all([inFlight, reader.get(scope)]);
  }
}

type Fault = (run: Run, prng: Prng) => Promise<void>;

function window(run: Run, kind: string, extra: { inst?: number; detail?: string } = {}) {
  const at = run.now();
  return () => run.history.add({ t: 'fault', kind, at, until: run.now(), ...extra });
}

const FAULTS: Record<string, Fault> = {
  'redis-kill': async (run, prng) => {
    const end = window(run, 'redis-kill', { detail: 'killed, restarted empty' });
    await run.fleet.redis.kill();
    await sleep(prng.int(200, 1500));
    await run.fleet.redis.restart();
    end();
  },
  'redis-restart': async (run, prng) => {
    const end = window(run, 'redis-restart', { detail: 'writes paused, SAVE, killed, restarted with its data' });
    // No write lands between the dump and the kill: the restart loses nothing.
    await redisCommands(run.fleet.redis.port, ['CLIENT PAUSE 10000 WRITE', 'SAVE']);
    await run.fleet.redis.kill();
    await sleep(prng.int(200, 1500));
    await run.fleet.redis.restart();
    // Loaded: the next restart empty must not find it.
    rmSync(join(run.fleet.redisDir, 'dump.rdb'), { force: true });
    end();
  },
  'redis-freeze': async (run, prng) => {
    const end = window(run, 'redis-freeze');
    run.fleet.redis.freeze();
    await sleep(prng.int(200, 1500));
    run.fleet.redis.thaw();
    end();
  },
  'relay-cut': async (run, prng) => {
    const inst = prng.pick(run.fleet.instances);
    const end = window(run, 'relay-cut', { inst: inst.index });
    inst.relay.cut();
    await sleep(prng.int(300, 3000));
    inst.relay.restore();
    end();
  },
  'relay-delay': async (run, prng) => {
    const inst = prng.pick(run.fleet.instances);
    const end = window(run, 'relay-delay', { inst: inst.index });
    inst.relay.hold();
    await sleep(prng.int(50, 800));
    inst.relay.release();
    end();
  },
  'inst-kill': async (run, prng) => {
    const inst = prng.pick(run.fleet.instances);
    const end = window(run, 'inst-kill', { inst: inst.index });
    await inst.stop('SIGKILL');
    await sleep(prng.int(200, 1500));
    await inst.start();
    end();
  },
  'inst-term': async (run, prng) => {
    const inst = prng.pick(run.fleet.instances);
    const end = window(run, 'inst-term', { inst: inst.index });
    await inst.stop('SIGTERM');
    await sleep(prng.int(100, 800));
    await inst.start();
    end();
  },
  sighup: async (run, prng) => {
    const base = run.shape.run.caps;
    const rate = prng.pick([1, 2, 3, 5, 8]);
    const caps: Caps = { ...base, rate, maxConcurrent: prng.pick([1, 2, 4, 8]), quota: { requests: Math.max(base.quota.requests, rate * 4), perSeconds: base.quota.perSeconds } };
    const ttl = prng.pick([0, 1, 2, 5, 30]);
    const { plans, keys } = changedPlansAndKeys(run, prng);
    run.fleet.rewrite(caps, ttl, { plans, keys });
    run.history.add({ t: 'config', at: run.now(), caps, ttl, plans, keys });
    for (const inst of run.fleet.instances) inst.hup();
    const end = window(run, 'sighup', { detail: `rate ${caps.rate}, max_concurrent ${caps.maxConcurrent}, ttl ${ttl}, plans ${JSON.stringify(plans)}, keys ${Object.keys(keys).join(' ')}` });
    end();
  },
  'provider-slow': providerFault((p) => ({ kind: 'slow', ms: p.int(200, 1800) })),
  'provider-fail': providerFault((p) => ({ kind: 'fail', status: p.pick([500, 502, 503]) })),
  'provider-reset': providerFault(() => ({ kind: 'reset' })),
  'provider-limit': providerFault((p) => ({ kind: 'limit', cred: p.pick(['c1', 'c2']), retryAfter: p.int(1, 5) })),
  'provider-reject': providerFault(() => ({ kind: 'reject', cred: 'c2' })),
  'provider-x-fail': async (run, prng) => {
    if (run.x === undefined) return;
    const end = window(run, 'provider-x-fail');
    run.x.fail = prng.pick([503, 500]);
    await sleep(prng.int(200, 2000));
    run.x.fail = undefined;
    end();
  },
};

/**
 * A reload's plans and keys: each plan but the budget's (whose limit perKeyBudget holds over the
 * whole run) kept, halved or doubled in capacity and refill; the key `extra` added or removed.
 */
function changedPlansAndKeys(run: Run, prng: Prng): { plans: Record<string, Plan>; keys: Record<string, string> } {
  const plans: Record<string, Plan> = {};
  for (const [name, plan] of Object.entries(run.fleet.plans)) {
    if (plan.budget !== undefined || prng.chance(0.5)) plans[name] = plan;
    else plans[name] = { capacity: Math.max(2, Math.round(plan.capacity * prng.pick([0.5, 2]))), refill: Math.max(1, Math.round(plan.refill * prng.pick([0.5, 1, 2]))) };
  }
  const keys: Record<string, string> = { ...run.fleet.keys };
  if (!run.shape.run.passThrough && prng.chance(0.5)) {
    if (keys['extra'] === undefined) keys['extra'] = 'mid';
    else delete keys['extra'];
  }
  return { plans, keys };
}

/** Sends inline commands to Redis and waits for one reply line each. */
function redisCommands(port: number, commands: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(commands.map((c) => `${c}\r\n`).join('')));
    let replies = '';
    socket.on('data', (d: Buffer) => {
      replies += d.toString();
      if (replies.split('\r\n').length > commands.length) {
        socket.destroy();
        if (replies.startsWith('-') || replies.includes('\r\n-')) reject(new Error(`redis: ${replies.trim()}`));
        else resolve();
      }
    });
    socket.on('error', reject);
  });
}

function providerFault(draw: (p: Prng) => Provider['mode']): Fault {
  return async (run, prng) => {
    const mode = draw(prng);
    const end = window(run, `provider-${mode.kind}`, { detail: JSON.stringify(mode) });
    run.provider.mode = mode;
    await sleep(prng.int(200, 2500));
    run.provider.mode = { kind: 'ok' };
    end();
  };
}

/** Faults drawn from the seed, one at a time, with quiet spells between them. */
async function nemesis(run: Run, prng: Prng): Promise<void> {
  // A slow provider twice as often as the rest: it is what fills max_concurrent.
  const kinds = [...Object.keys(FAULTS), 'provider-slow'];
  while (run.now() < run.endsAt - 1000) {
    await sleep(prng.int(1000, 5000));
    if (run.now() >= run.endsAt - 1000) break;
    await FAULTS[prng.pick(kinds)]!(run, prng);
  }
}
