import type { Layer, Provider } from './upstream.js';

/**
 * Answers a request the provider is known to refuse (an id or a username its own rules cannot
 * match) without a call. Outermost, so such a request costs nothing below: no breaker or throttle
 * verdict, no credential, no budget, no place under the call cap. Its answer is marked `unasked`,
 * so nothing that trusts a provider's word (pass-through verification above all) mistakes it
 * for one: a made-up key asking for an impossible id learns nothing and is accepted by nothing.
 */
export function answerKnown(known: Provider['known']): Layer {
  return (next) => {
    if (known === undefined) return next;
    return (attempt) => {
      const answer = known(attempt.request);
      return answer === undefined ? next(attempt) : Promise.resolve(answer);
    };
  };
}
