import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';
import type { RedisConfig } from '../config/types.js';

export type RedisClient = Redis | Cluster;

/** Longest pause between reconnection attempts: short, so perch is back soon after Redis is. */
const MAX_RECONNECT_DELAY_MS = 1000;

/**
 * Opens a client for a validated Redis section. Commands fail at once while disconnected (no
 * offline queue: a queued command would hold its request hostage) and time out after
 * `command_timeout_ms`; the client reconnects by itself. Callers treat every failure as "Redis
 * unavailable" and carry on without it.
 */
export function createRedisClient(config: RedisConfig, connectionName: string): RedisClient {
  const common: RedisOptions = {
    connectionName,
    enableOfflineQueue: false,
    commandTimeout: config.command_timeout_ms,
    connectTimeout: Math.max(1000, config.command_timeout_ms),
    maxRetriesPerRequest: 0,
    retryStrategy: (attempt) => Math.min(attempt * 100, MAX_RECONNECT_DELAY_MS),
  };
  if (config.cluster !== undefined) {
    const options: ClusterOptions = {
      enableOfflineQueue: false,
      redisOptions: common,
      clusterRetryStrategy: (attempt) => Math.min(attempt * 100, MAX_RECONNECT_DELAY_MS),
    };
    return new Cluster(
      config.cluster.map((seed) => {
        const url = new URL(seed);
        return { host: url.hostname, port: Number(url.port || 6379) };
      }),
      options,
    );
  }
  if (config.sentinels !== undefined) {
    return new Redis({
      ...common,
      sentinels: config.sentinels.map((address) => {
        const i = address.lastIndexOf(':');
        return { host: address.slice(0, i), port: Number(address.slice(i + 1)) };
      }),
      name: config.name,
    });
  }
  return new Redis(config.url!, common);
}
