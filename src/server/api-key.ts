import type { IncomingMessage } from 'node:http';

/**
 * The `X-API-Key` a request presents: its value, or every value when the header is repeated,
 * which no key store accepts (a repeated key is ambiguous). Node joins a repeated header's values
 * into one string with ", ", which would read as one key made of both and, with pass-through
 * auth, be forwarded to the provider as such. Only a value with a comma is looked at again, so a
 * plain key costs nothing more; one header whose key holds a comma stays that key.
 */
export function presentedKey(req: IncomingMessage): string | string[] | undefined {
  const joined = req.headers['x-api-key'];
  if (typeof joined !== 'string' || !joined.includes(',')) return joined;
  const values = req.headersDistinct['x-api-key'];
  return values !== undefined && values.length > 1 ? values : joined;
}
