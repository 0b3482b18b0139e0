import { readFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { fileURLToPath } from 'node:url';

const DIR = fileURLToPath(new URL('../../../test/fixtures/x_v2/', import.meta.url));

/** A recorded-shape X API v2 payload from test/fixtures/x_v2, parsed afresh on each call. */
export function xFixture(name: string): any {
  return JSON.parse(readFileSync(`${DIR}${name}.json`, 'utf8'));
}

/** The same payload as the bytes a stand-in serves. */
export function xFixtureText(name: string): string {
  return readFileSync(`${DIR}${name}.json`, 'utf8');
}

/**
 * Answers `GET /2/users/me` as X does for an app-only bearer token, which that endpoint (user
 * context only) refuses: 403 unsupported-authentication. Whether it was that request.
 */
export function answerAppOnlyWhoAmI(req: IncomingMessage, res: ServerResponse): boolean {
  if (req.url !== '/2/users/me') return false;
  const body = JSON.stringify({
    title: 'Unsupported Authentication',
    detail: 'Authenticating with OAuth 2.0 Application-Only is forbidden for this endpoint.  Supported authentication types are [OAuth 1.0a User Context, OAuth 2.0 User Context].',
    type: 'https://api.twitter.com/2/problems/unsupported-authentication',
    status: 403,
  });
  res.writeHead(403, { 'content-type': 'application/problem+json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
  return true;
}
