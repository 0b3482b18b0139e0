import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
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
  mode: ProviderMode;
  /** Keys the provider accepts in pass-through (X-API-Key); others are 401. */
  readonly genuine: Set<string>;
  /** The body of `resource` changes: its next answer carries the next version. */
  change(resource: string): void;
  close(): Promise<void>;
}

export type CallSink = (call: CallEvent) => void;

/** The perch instance behind a connection, by its client and server ports (fleet.ts `connectionOwner`). */
export type Caller = (clientPort: number, serverPort: number) => number | undefined;

/** Each connection's instance, looked up once found: undici keeps its connections, so few are. */
function callers(caller: Caller | undefined): (req: IncomingMessage) => { inst?: number } {
  const known = new WeakMap<object, number>();
  return (req) => {
    const socket = req.socket;
    let inst = known.get(socket);
    if (inst === undefined && caller !== undefined && socket.remotePort !== undefined && socket.localPort !== undefined) {
      inst = caller(socket.remotePort, socket.localPort);
      if (inst !== undefined) known.set(socket, inst);
    }
    return inst === undefined ? {} : { inst };
  };
}

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
export async function startV1Provider(now: () => number, sink: CallSink, passThrough: boolean, caller?: Caller): Promise<Provider> {
  const versions = new Map<string, number>();
  const callerOf = callers(caller);
  const provider = { url: '', mode: { kind: 'ok' } as ProviderMode, genuine: new Set<string>(), change: (r: string) => void versions.set(r, (versions.get(r) ?? 1) + 1), close: async () => {} };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const start = now();
    const id = ++nextCall;
    const by = callerOf(req);
    const path = (req.url ?? '/').split('?')[0]!;
    const key = String(req.headers['x-api-key'] ?? '');
    const cred = passThrough ? key : key.replace(/^cred-/, '');
    const mode = provider.mode;
    let status = 0;
    let version: number | undefined;
    let retryAfter: number | undefined;
    res.on('close', () => sink({ t: 'call', id, upstream: 'v1', ...by, path, resources: [path], cred, start, end: now(), status: res.writableFinished ? status : 0, ...(version === undefined ? {} : { versions: [version] }), ...(retryAfter === undefined ? {} : { retryAfter }) }));
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
  provider.url = await listen(server);
  provider.close = closer(server);
  return provider;
}

export interface XProvider {
  readonly url: string;
  fail: number | undefined;
  close(): Promise<void>;
}

/** The X API v2 stand-in of the tests, its calls reported with the client resources each serves. */
export async function startXProvider(now: () => number, sink: CallSink, caller?: Caller): Promise<XProvider> {
  const x = fakeX();
  const callerOf = callers(caller);
  const server = createServer((req, res) => {
    const start = now();
    const id = ++nextCall;
    const by = callerOf(req);
    const url = new URL(req.url ?? '/', 'http://x');
    const resources = xResources(url);
    res.on('close', () => sink({ t: 'call', id, upstream: 'x', ...by, path: url.pathname + url.search, resources, cred: 'x', start, end: now(), status: res.writableFinished ? res.statusCode : 0 }));
    x.failWith = provider.fail === undefined ? undefined : { status: provider.fail };
    x.behaviour(req, res);
  });
  const provider: XProvider = { url: await listen(server), fail: undefined, close: closer(server) };
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
