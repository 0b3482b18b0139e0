import { checkHeaders } from './rules-upstreams.js';
import type { TracingConfig } from './schema.js';
import type { Problems } from './schema-helpers.js';

/**
 * The collector's base URL takes a path (a collector behind a prefix), since `/v1/traces` is
 * appended to it; messages do not echo it, nor the headers, which usually carry a token.
 */
export function checkTracing(problems: Problems, tracing: TracingConfig): void {
  let url: URL | undefined;
  try {
    url = new URL(tracing.endpoint);
  } catch {
    problems.add('tracing.endpoint', 'must be an absolute http: or https: URL');
  }
  if (url !== undefined) {
    if (url.protocol !== 'http:' && url.protocol !== 'https:') problems.add('tracing.endpoint', 'must use http: or https:');
    if (url.username !== '' || url.password !== '') problems.add('tracing.endpoint', 'must not contain a username or password (put credentials in headers)');
    if (url.search !== '' || url.hash !== '') problems.add('tracing.endpoint', 'must not have a query or fragment');
  }
  checkHeaders(problems, tracing.headers, 'tracing.headers');
}
