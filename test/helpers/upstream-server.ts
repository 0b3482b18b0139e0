import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { TestContext } from 'node:test';
import { SAMPLE_BODIES } from './sample-bodies.js';
import { onCleanup } from './cleanup.js';

export interface RecordedRequest {
  readonly method: string;
  readonly url: string;
  readonly headers: IncomingMessage['headers'];
}

export type UpstreamBehaviour = (req: IncomingMessage, res: ServerResponse) => void;

export interface TestUpstream {
  readonly url: string;
  readonly requests: RecordedRequest[];
  /** Replaceable mid-test, e.g. to make a healthy upstream start failing. */
  behaviour: UpstreamBehaviour;
}

/**
 * A real HTTP server on 127.0.0.1, port 0, standing in for a provider. It records every request
 * and answers with `behaviour`; it is closed (connections included) when the test ends.
 */
export async function startUpstream(t: TestContext, behaviour: UpstreamBehaviour): Promise<TestUpstream> {
  const upstream: TestUpstream = { url: '', requests: [], behaviour };
  const server = createServer((req, res) => {
    upstream.requests.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers });
    upstream.behaviour(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  onCleanup(t, () => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const { port } = server.address() as AddressInfo;
  return Object.assign(upstream, { url: `http://127.0.0.1:${port}` });
}

/** Answers JSON with the given status. */
export function json(status: number, body: unknown, headers: Record<string, string> = {}): UpstreamBehaviour {
  const bytes = Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  return (_req, res) => {
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': bytes.length, ...headers });
    res.end(bytes);
  };
}

/** Every `every`-th call gets `failure`, the others the sample provider's answer (the first call succeeds). */
export function failingEvery(every: number, failure: UpstreamBehaviour): UpstreamBehaviour {
  let calls = 0;
  return (req, res) => (++calls % every === 0 ? failure(req, res) : sampleProvider(req, res));
}

/** A port that had a listener a moment ago and now refuses connections. */
export async function refusedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Answers each path with the sample body of the endpoint it names. */
export const sampleProvider: UpstreamBehaviour = (req, res) => {
  const path = (req.url ?? '').split('?')[0]!;
  const body = path.startsWith('/v1/tweets/')
    ? SAMPLE_BODIES.tweet
    : path.endsWith('/tweets')
      ? SAMPLE_BODIES.tweets
      : path.endsWith('/replies')
        ? SAMPLE_BODIES.replies
        : path.endsWith('/following')
          ? SAMPLE_BODIES.following
          : SAMPLE_BODIES.user;
  json(200, body)(req, res);
};
