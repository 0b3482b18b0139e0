import type { RunningPerch, TestResponse } from './perch.js';

export const ADMIN_KEY = 'admin-key-charlie-0123456789';

/** An `admin` section for `testConfig`'s extra YAML, with the one admin key. */
export const ADMIN_YAML = `admin:\n  keys:\n    - { id: ops, key: "${ADMIN_KEY}" }`;

export interface PurgeOptions {
  /** Default: the admin key; null sends none. */
  readonly key?: string | null;
  readonly method?: string;
  /** Default `application/json`; null sends none. */
  readonly contentType?: string | null;
}

/** `POST /admin/purge` with `body` (an object is sent as JSON, a string as is). */
export async function purge(perch: RunningPerch, body: unknown, options: PurgeOptions = {}): Promise<TestResponse> {
  const headers: Record<string, string> = {};
  const key = options.key === undefined ? ADMIN_KEY : options.key;
  if (key !== null) headers['x-api-key'] = key;
  const contentType = options.contentType === undefined ? 'application/json' : options.contentType;
  if (contentType !== null) headers['content-type'] = contentType;
  const method = options.method ?? 'POST';
  const payload = method === 'GET' || method === 'HEAD' ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
  const response = await fetch(`${perch.url}/admin/purge`, { method, headers, body: payload });
  const text = await response.text();
  return { status: response.status, headers: response.headers, text, json: () => JSON.parse(text) };
}

/** The `Cache-Status` of a GET of `path`, reduced to what the purge tests compare. */
export async function outcome(perch: RunningPerch, path: string): Promise<'memory' | 'redis' | 'miss' | string> {
  const status = (await perch.request(path)).headers.get('cache-status') ?? '';
  if (/^perch; hit; ttl=\d+$/.test(status)) return 'memory';
  if (/^perch; hit; ttl=\d+; detail=redis$/.test(status)) return 'redis';
  if (status.startsWith('perch; fwd=miss') && !status.includes('collapsed')) return 'miss';
  return status;
}
