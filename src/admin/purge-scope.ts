import type { PurgeTarget } from '../cache/generations.js';
import { canonicalParameter, ENDPOINT_NAMES, INVALID, PARAMETER_PATTERNS, PATH_PARAMETER, isEndpointName, type EndpointName } from '../endpoints.js';

/** A purge body, read: what to purge and how to echo it, or the message naming the problem. */
export type PurgeScope =
  | { readonly kind: 'ok'; readonly target: PurgeTarget; readonly label: EndpointName | 'all'; readonly echo: Readonly<Record<string, unknown>> }
  | { readonly kind: 'invalid'; readonly message: string };

/**
 * Reads `{"endpoint":"tweets","user_id":"123"}` (the endpoint and its path parameter) or
 * `{"all":true}`. Strict: any other key is refused rather than ignored, since a purge that
 * silently covers less than the operator meant would look like it worked. The parameter is
 * normalized as the route normalizes it (username lowercased), and the echo says so.
 */
export function readPurgeScope(body: Buffer): PurgeScope {
  let raw: unknown;
  try {
    raw = JSON.parse(body.toString('utf8'));
  } catch {
    return invalid('Invalid request: the body must be JSON');
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return invalid('Invalid request: the body must be a JSON object');
  const fields = raw as Record<string, unknown>;
  const keys = Object.keys(fields);

  if (Object.hasOwn(fields, 'all')) {
    if (fields.all !== true) return invalid('Invalid parameter: all must be true');
    const extra = keys.find((key) => key !== 'all');
    if (extra !== undefined) return invalid(`Invalid parameter: unknown key ${JSON.stringify(extra)} (all takes no other key)`);
    return { kind: 'ok', target: 'all', label: 'all', echo: { all: true } };
  }

  const endpoint = fields.endpoint;
  if (endpoint === undefined) return invalid('Invalid request: the body needs endpoint and its parameter, or all');
  if (typeof endpoint !== 'string' || !isEndpointName(endpoint)) {
    return invalid(`Invalid parameter: endpoint must be one of ${ENDPOINT_NAMES.join(', ')}`);
  }
  const parameter = PATH_PARAMETER[endpoint];
  const extra = keys.find((key) => key !== 'endpoint' && key !== parameter);
  if (extra !== undefined) return invalid(`Invalid parameter: unknown key ${JSON.stringify(extra)} (${endpoint} takes ${parameter})`);
  const value = fields[parameter];
  if (value === undefined) return invalid(`Invalid parameter: ${parameter} is required for endpoint ${endpoint}`);
  if (typeof value !== 'string' || !PARAMETER_PATTERNS[parameter].test(value)) return invalid(INVALID[parameter]);
  const normalized = canonicalParameter(parameter, value);
  return { kind: 'ok', target: `${endpoint}:${normalized}`, label: endpoint, echo: { endpoint, [parameter]: normalized } };
}

function invalid(message: string): PurgeScope {
  return { kind: 'invalid', message };
}
