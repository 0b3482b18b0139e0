import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import type { AddressInfo, Socket } from 'node:net';
import { fakeX } from '../test/helpers/fake-x.js';
import { SAMPLE_BODIES, sampleUser, sampleTweet } from '../test/helpers/sample-bodies.js';
import type { CallEvent } from './history.js';

/** What the scripted provider does to the calls that arrive while it holds. */
export type ProviderMode =
  | { readonly kind: 'ok' }
  | { readonly kind: 'slow'; readonly ms: number }
  | { readonly kind: 'fail'; readonly status: number }
  | { readonly kind: 'reset' }
  | { readonly kind: 'limit'; readonly cred: string; readonly retryAfter: number }
  | { readonly kind: 'reject'; readonly cred: string };

/** Texts of the sample bodies the version marker replaces, one per body shape. */
const MARKED = ['Reads a lot.', 'hello #perch https://t.co/abc', '@Bob indeed', 'Writes a lot.'];

/** The version a body carries, `fleet_v<n>_`, or undefined. */
export function versionOf(body: string): number | undefined {
  const m = /fleet_v(\d+)_/.exec(body);
  return m === null ? undefined : Number(m[1]);
}

/** The id a username's user has: outside the ids the workload asks for by id. */
export function idOfName(name: string): string {
  let h = 7;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) % 100_000;
  return String(900_000 + h);
}

function bodyFor(path: string, version: number): string | undefined {
  let m: RegExpExecArray | null;
  let body: unknown;
  if ((m = /^\/v1\/users\/by\/username\/([A-Za-z0-9_]+)$/.exec(path)) !== null) body = sampleUser(idOfName(m[1]!.toLowerCase()), m[1]!);
  else if ((m = /^\/v1\/users\/(\d+)$/.exec(path)) !== null) body = sampleUser(m[1]!, `user${m[1]}`);
  else if ((m = /^\/v1\/tweets\/(\d+)$/.exec(path)) !== null) body = sampleTweet(m[1]!);
  else if (/^\/v1\/users\/\d+\/tweets$/.test(path)) body = SAMPLE_BODIES.tweets;
  else if (/^\/v1\/users\/\d+\/replies$/.test(path)) body = SAMPLE_BODIES.replies;
  else if (/^\/v1\/users\/\d+\/following$/.test(path)) body = SAMPLE_BODIES.following;
  else return undefined;
  let text = JSON.stringify(body);
  const marked = MARKED.find((s) => text.includes(s))!;
  text = text.replace(marked, `fleet_v${version}_ ${marked}`);
  return text;
}

export interface Provider {
  readonly url: string;
  /** Resolves once no call has been open for `ms`. */
  quiet(ms: number): Promise<void>;
  /** Tells which instance opened a connection, so each call is known by its instance. */
  owner: Owner | undefined;
  mode: ProviderMode;
  /** Keys the provider accepts in pass-through (X-API-Key); others are 401. */
  readonly genuine: Set<string>;
  /** The body of `resource` changes: its next answer carries the next version. */
  change(resource: string): void;
  close(): Promise<void>;
}

export type CallSink = (call: CallEvent) => void;

function listen(server: Server): Promise<string> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)));
}

function closer(server: Server): () => Promise<void> {
  return () => {
    server.closeAllConnections();
    return new Promise((resolve) => server.close(() => resolve()));
  };
}

let nextCall = 0;

/**
 * The v1 provider: every body carries its resource's version; credentials are told apart by
 * their X-API-Key (`cred-<id>` in keys mode, the client's key in pass-through). Every call is
 * reported with its arrival and end times, as the provider saw them.
 */
export async function startV1Provider(now: () => number, sink: CallSink, passThrough: boolean): Promise<Provider> {
  const versions = new Map<string, number>();
  const flights = new Flights();
  const provider: { -readonly [K in keyof Provider]: Provider[K] } = { url: '', mode: { kind: 'ok' }, genuine: new Set<string>(), change: (r: string) => void versions.set(r, (versions.get(r) ?? 1) + 1), close: async () => {}, quiet: (ms: number) => flights.quiet(ms), owner: undefined };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const start = now();
    const id = ++nextCall;
    flights.open(res);
    const inst = owners.get(req.socket);
    const path = (req.url ?? '/').split('?')[0]!;
    const key = String(req.headers['x-api-key'] ?? '');
    const cred = passThrough ? key : key.replace(/^cred-/, '');
    const mode = provider.mode;
    let status = 0;
    let version: number | undefined;
    let retryAfter: number | undefined;
    res.on('close', () => sink({ t: 'call', id, upstream: 'v1', path, resources: [path], cred, start, end: now(), status: res.writableFinished ? status : 0, ...(version === undefined ? {} : { versions: [version] }), ...(retryAfter === undefined ? {} : { retryAfter }), ...(inst === undefined ? {} : { inst }) }));
    const answer = () => {
      if (res.destroyed) return;
      if (mode.kind === 'reset') return void req.socket.destroy();
      const send = (s: number, body: string, headers: Record<string, string> = {}) => {
        status = s;
        res.writeHead(s, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers });
        res.end(body);
      };
      if (mode.kind === 'fail') return send(mode.status, '{"error":"failing"}');
      if (passThrough ? !provider.genuine.has(key) : mode.kind === 'reject' && mode.cred === cred) return send(401, '{"error":"unauthorized"}');
      if (mode.kind === 'limit' && (passThrough || mode.cred === cred)) {
        retryAfter = mode.retryAfter;
        return send(429, '{"error":"slow down"}', { 'retry-after': String(mode.retryAfter) });
      }
      const v = versions.get(path) ?? 1;
      const body = bodyFor(path, v);
      if (body === undefined) return send(404, '{"error":"not found"}');
      version = v;
      send(200, body);
    };
    // A provider takes its time: 20-119 ms, more while it is slow, so calls overlap as they do.
    setTimeout(answer, (mode.kind === 'slow' ? mode.ms : 0) + 20 + ((id * 37) % 100));
  });
  const owners = ownersOf(server, () => provider.owner);
  provider.url = await listen(server);
  provider.close = closer(server);
  return provider;
}

/**
 * Each connection's instance, as `owner` tells it when the connection opens. Every instance
 * calls the same URL with the same credentials (a URL or a header of its own would change what
 * perch shares: pass-through verdicts, a credential's stops), so the stand-in asks the kernel
 * which process holds the other end.
 */
function ownersOf(server: Server, owner: () => Owner | undefined): WeakMap<Socket, number> {
  const owners = new WeakMap<Socket, number>();
  server.on('connection', (socket: Socket) => {
    const inst = owner()?.(socket.remotePort ?? 0, socket.localPort ?? 0);
    if (inst !== undefined) owners.set(socket, inst);
  });
  return owners;
}

/** Which instance holds the client end (`remotePort`) of a connection to a stand-in on `localPort`. */
export type Owner = (remotePort: number, localPort: number) => number | undefined;

/**
 * On Linux: the inode of the socket on 127.0.0.1:`clientPort` connected to `serverPort`
 * (/proc/net/tcp), then the process among `pids` (and their children: workers) holding it.
 */
export function socketOwner(clientPort: number, serverPort: number, pids: ReadonlyMap<number, number>): number | undefined {
  const hex = (port: number) => port.toString(16).toUpperCase().padStart(4, '0');
  let table: string;
  try {
    table = readFileSync('/proc/net/tcp', 'utf8');
  } catch {
    return undefined;
  }
  const line = table.split('\n').find((l) => {
    const f = l.trim().split(/\s+/);
    return f[1] === `0100007F:${hex(clientPort)}` && f[2] === `0100007F:${hex(serverPort)}`;
  });
  const inode = line?.trim().split(/\s+/)[9];
  if (inode === undefined) return undefined;
  const holds = (pid: number) => {
    try {
      return readdirSync(`/proc/${pid}/fd`).some((fd) => {
        try {
          return readlinkSync(`/proc/${pid}/fd/${fd}`) === `socket:[${inode}]`;
        } catch {
          return false;
        }
      });
    } catch {
      return false;
    }
  };
  for (const [pid, inst] of pids) if (holds(pid)) return inst;
  for (const [pid, inst] of pids) for (const child of childrenOf(pid)) if (holds(child)) return inst;
  return undefined;
}

function childrenOf(pid: number): number[] {
  try {
    return readdirSync(`/proc/${pid}/task`).flatMap((task) =>
      readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8')
        .split(' ')
        .filter((s) => s.trim() !== '')
        .map(Number),
    );
  } catch {
    return [];
  }
}

/** The calls a stand-in is answering, to wait until none is before counters are compared. */
class Flights {
  #open = 0;
  #lastClose = 0;

  open(res: ServerResponse): void {
    this.#open++;
    res.on('close', () => {
      this.#open--;
      this.#lastClose = performance.now();
    });
  }

  /** Resolves once no call has been open for `ms` (or after 10 s, so a run always ends). */
  async quiet(ms: number): Promise<void> {
    const deadline = performance.now() + 10_000;
    while (performance.now() < deadline && (this.#open > 0 || performance.now() - this.#lastClose < ms)) await new Promise((r) => setTimeout(r, 50));
  }
}

export interface XProvider {
  readonly url: string;
  quiet(ms: number): Promise<void>;
  owner: Owner | undefined;
  fail: number | undefined;
  close(): Promise<void>;
}

/** The X API v2 stand-in of the tests, its calls reported with the client resources each serves. */
export async function startXProvider(now: () => number, sink: CallSink): Promise<XProvider> {
  const x = fakeX();
  const flights = new Flights();
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const start = now();
    const id = ++nextCall;
    flights.open(res);
    const inst = owners.get(req.socket);
    const url = new URL(req.url ?? '/', 'http://x');
    const resources = xResources(url);
    res.on('close', () => sink({ t: 'call', id, upstream: 'x', path: url.pathname + url.search, resources, cred: 'x', start, end: now(), status: res.writableFinished ? res.statusCode : 0, ...(inst === undefined ? {} : { inst }) }));
    x.failWith = provider.fail === undefined ? undefined : { status: provider.fail };
    x.behaviour(req, res);
  });
  const owners = ownersOf(server, () => provider.owner);
  const provider: XProvider = { url: await listen(server), fail: undefined, quiet: (ms) => flights.quiet(ms), owner: undefined, close: closer(server) };
  return provider;
}

function xResources(url: URL): string[] {
  const p = url.pathname;
  const list = (name: string) => (url.searchParams.get(name) ?? '').split(',').filter((s) => s !== '');
  if (p === '/2/users') return list('ids').map((i) => `/v1/users/${i}`);
  if (p === '/2/tweets') return list('ids').map((i) => `/v1/tweets/${i}`);
  if (p === '/2/users/by') return list('usernames').map((n) => `/v1/users/by/username/${n.toLowerCase()}`);
  const m = /^\/2\/users\/by\/username\/(.+)$/.exec(p);
  if (m !== null) return [`/v1/users/by/username/${m[1]!.toLowerCase()}`];
  const single = /^\/2\/(users|tweets)\/(\d+)$/.exec(p);
  if (single !== null) return [`/v1/${single[1]}/${single[2]}`];
  return [p];
}
