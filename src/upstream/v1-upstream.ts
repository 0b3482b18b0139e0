import type { V1UpstreamConfig } from '../config/types.js';
import { checkResponseBody } from '../schemas/response-check.js';
import { createHttpProvider, failed, type Dialect, type HttpProviderOptions } from './http-provider.js';
import type { Provider } from './upstream.js';

/** Options of a `v1` provider: the clock and, for tests and embedders, the dispatcher. */
export type V1UpstreamOptions = HttpProviderOptions;

/**
 * A provider that speaks this same interface: the request's normalized path goes out as it is,
 * and a 2xx body is passed through byte for byte once it has the endpoint's full shape.
 */
const V1_DIALECT: Dialect = {
  path: (request) => request.path,
  rejectsCredential: [401, 403],
  success(request, parsed, raw, status) {
    const mismatch = checkResponseBody(request.endpoint, parsed);
    if (mismatch !== undefined) return failed('invalid_body', `status ${status} with a body not of the ${request.endpoint} schema: ${mismatch}`, status);
    return { kind: 'ok', body: raw };
  },
};

/** The innermost layer of a `v1` upstream. */
export function createV1Upstream(name: string, config: V1UpstreamConfig, options: V1UpstreamOptions): Provider {
  return createHttpProvider(name, config, V1_DIALECT, options);
}
