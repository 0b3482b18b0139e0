import { canonicalParameter, PARAMETER_PATTERNS, type EndpointName, type EndpointRequest } from '../endpoints.js';

/**
 * A user fetched by username is also the answer to the by-id route and the other way round, so
 * a 200 of either is stored under both keys. Returns the other route's request for the user a
 * body describes, or undefined: not a user endpoint, not JSON, or an id or username that fails
 * its parameter rule. The body is parsed here only, on a miss, and never on a hit.
 */
export function counterpart(endpoint: EndpointName, body: Buffer): EndpointRequest | undefined {
  if (endpoint !== 'user' && endpoint !== 'user_by_username') return undefined;
  let user: unknown;
  try {
    user = JSON.parse(body.toString('utf8'));
  } catch {
    return undefined;
  }
  if (typeof user !== 'object' || user === null) return undefined;
  const { id, username } = user as { id?: unknown; username?: unknown };
  if (endpoint === 'user_by_username') {
    if (typeof id !== 'string' || !PARAMETER_PATTERNS.user_id.test(id)) return undefined;
    const canonical = canonicalParameter('user_id', id);
    return { endpoint: 'user', params: { user_id: canonical }, path: `/v1/users/${canonical}` };
  }
  if (typeof username !== 'string' || !PARAMETER_PATTERNS.username.test(username)) return undefined;
  const lower = canonicalParameter('username', username);
  return { endpoint: 'user_by_username', params: { username: lower }, path: `/v1/users/by/username/${lower}` };
}
