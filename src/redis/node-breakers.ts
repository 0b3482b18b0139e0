import calculateSlot from 'cluster-key-slot';
import { Cluster } from 'ioredis';
import type { Clock } from '../clock.js';
import type { Logger } from '../logging/logger.js';
import { Breaker, type BreakerState } from './breaker.js';
import type { RedisClient } from './redis-client.js';

export interface NodeBreakersOptions {
  readonly clock: Clock;
  readonly logger: Logger;
  /** What the breakers guard, for their log lines. */
  readonly name: string;
}

/** Worst first: the state reported for the whole Redis is its worst node's. */
const SEVERITY: Readonly<Record<BreakerState, number>> = { closed: 0, half_open: 1, open: 2 };

/**
 * Where Redis calls for a key may go: one breaker for a single node (or a Sentinel-managed
 * master), one per master node for a Redis Cluster. A dead cluster node then costs only the keys
 * of its slots, and successes on healthy nodes cannot close the breaker of a dead one.
 *
 * A cluster node's breaker opens on its first failure rather than after five: a miss makes
 * several calls with keys on the same node (lookup, store, a lease on the same or another node),
 * and each failed call against a dead node is a full command timeout. Opening at once keeps that
 * to one per miss; the price of a transient failure is that node's slots going without the shared
 * tier until the next probe, 2 s later, while the other nodes keep serving.
 */
export class NodeBreakers {
  readonly #cluster: Cluster | undefined;
  readonly #options: NodeBreakersOptions;
  readonly #single: Breaker;
  readonly #byNode = new Map<string, Breaker>();

  constructor(client: RedisClient, options: NodeBreakersOptions) {
    this.#cluster = client instanceof Cluster ? client : undefined;
    this.#options = options;
    this.#single = new Breaker(options);
    // Every (re)connection may reach a different, healthy node: after a Sentinel failover the
    // new master should be used as soon as the client is connected to it, not a cool-down later.
    client.on('ready', () => {
      this.#single.probeSoon();
      for (const breaker of this.#byNode.values()) breaker.probeSoon();
    });
  }

  /** The breaker guarding the node that holds `key` (a full Redis key, prefix included). */
  for(key: string): Breaker {
    const cluster = this.#cluster;
    if (cluster === undefined) return this.#single;
    // Master first in each slot's list. Before the slot map is known every key shares one breaker.
    const node = cluster.slots[calculateSlot(key)]?.[0];
    if (node === undefined) return this.#single;
    let breaker = this.#byNode.get(node);
    if (breaker === undefined) {
      breaker = new Breaker({ ...this.#options, node, threshold: 1 });
      this.#byNode.set(node, breaker);
    }
    return breaker;
  }

  /**
   * The worst state of any current master's breaker: `closed` only while every node is in use.
   * Breakers of nodes that no longer own slots (a master replaced by its replica) are dropped:
   * no key maps to them any more, so nothing would ever probe and close them.
   */
  get state(): BreakerState {
    let worst = this.#single.state;
    if (this.#cluster !== undefined) {
      // From the slot map, not the connection pool: ioredis drops a dead node's connection while
      // its slots still point at it, and its breaker must stay open for them.
      const masters = new Set(this.#cluster.slots.map((nodes) => nodes[0]));
      for (const node of this.#byNode.keys()) if (!masters.has(node)) this.#byNode.delete(node);
    }
    for (const breaker of this.#byNode.values()) {
      if (SEVERITY[breaker.state] > SEVERITY[worst]) worst = breaker.state;
    }
    return worst;
  }
}
