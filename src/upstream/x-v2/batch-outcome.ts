import type { EndpointRequest } from '../../endpoints.js';
import { notVisible, problemType } from './outcome.js';
import { object, optionalList, type Json } from './read.js';
import { BATCH_PARAMETER, itemOf, type BatchEndpoint } from './requests.js';

/**
 * What a batch answer says of one item it was asked: the body its single lookup would have got
 * (the `data[]` entry, with the answer's `includes`, which hold the authors and media of every
 * tweet), that it is not there for this app, another problem X named, or nothing at all.
 */
export type ItemOutcome =
  | { readonly kind: 'data'; readonly body: Json }
  | { readonly kind: 'not_found' }
  | { readonly kind: 'errors'; readonly type: string }
  | { readonly kind: 'missing' };

/**
 * Reads X's batch answer item by item. `data[]` entries are matched by `id` (by `username`,
 * case-insensitively, for usernames); `errors[]` entries only where they are about an asked item
 * (`parameter` `ids` or `usernames`, matched by `resource_id`, else `value`): errors about what
 * an expansion referred to (`pinned_tweet_id`, a tweet's author, `section: "includes"`) concern
 * no item asked for and change nothing. Throws a `MappingError` when the body is not of the batch
 * shape at all, which fails the whole call as the single lookups' bodies do.
 */
export function batchOutcomes(requests: readonly EndpointRequest[], body: unknown): ItemOutcome[] {
  const endpoint = requests[0]!.endpoint as BatchEndpoint;
  const top = object(body, '');
  const includes = top.includes;
  const found = new Map<string, Json>();
  for (const [i, entry] of optionalList(top.data, '/data').entries()) {
    const item = object(entry, `/data/${i}`);
    const key = endpoint === 'user_by_username' ? item.username : item.id;
    if (typeof key === 'string') found.set(endpoint === 'user_by_username' ? key.toLowerCase() : key, item);
  }
  const parameter = BATCH_PARAMETER[endpoint];
  const problems = new Map<string, Json>();
  for (const entry of optionalList(top.errors, '/errors')) {
    if (typeof entry !== 'object' || entry === null) continue;
    const error = entry as Json;
    if (error.parameter !== parameter || error.section === 'includes') continue;
    const subject = typeof error.resource_id === 'string' ? error.resource_id : error.value;
    if (typeof subject === 'string') problems.set(endpoint === 'user_by_username' ? subject.toLowerCase() : subject, error);
  }
  return requests.map((request): ItemOutcome => {
    const key = itemOf(request);
    const data = found.get(key);
    if (data !== undefined) return { kind: 'data', body: includes === undefined ? { data } : { data, includes } };
    const problem = problems.get(key);
    if (problem === undefined) return { kind: 'missing' };
    return notVisible(problem) ? { kind: 'not_found' } : { kind: 'errors', type: problemType(problem) };
  });
}
