import { readFileSync } from 'node:fs';
import type { ConnectionOptions } from 'node:tls';
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';
import type { RedisConfig } from '../config/types.js';

export type RedisClient = Redis | Cluster;

/** Longest pause between reconnection attempts: short, so perch is back soon after Redis is. */
export const MAX_RECONNECT_DELAY_MS = 1000;
/**
 * How soon a lost connection to a sentinel is retried. ioredis waits a minute by default, and
 * while it waits no failover announcement reaches perch from that sentinel.
 */
const SENTINEL_RECONNECT_MS = 1000;

/** Where one node is and how to log in, from a `redis://` or `rediss://` URL. */
interface NodeAddress {
  readonly host: string;
  readonly port: number;
  readonly username?: string;
  readonly password?: string;
  readonly db?: number;
  readonly tls: boolean;
}

/**
 * Opens a client for a validated Redis section (`path` names it in errors). Commands fail at
 * once while disconnected (no offline queue: a queued command would hold its request hostage) and
 * time out after `command_timeout_ms`; the client reconnects by itself. Callers treat every
 * failure as "Redis unavailable" and carry on without it. Throws when `tls_ca_file` cannot be read.
 */
export function createRedisClient(config: RedisConfig, connectionName: string, path = 'cache.redis'): RedisClient {
  const ca = config.tls_ca_file === undefined ? undefined : readCa(config.tls_ca_file, `${path}.tls_ca_file`);
  const tls = (on: boolean | undefined): ConnectionOptions | undefined => (on === true ? (ca === undefined ? {} : { ca }) : undefined);
  const common: RedisOptions = {
    connectionName,
    enableOfflineQueue: false,
    commandTimeout: config.command_timeout_ms,
    connectTimeout: Math.max(1000, config.command_timeout_ms),
    maxRetriesPerRequest: 0,
    // How long leaving a connection waits for the server's side of the close. A frozen master
    // never sends it, and until the socket is gone the client does not look for the new one
    // (ioredis waits 2 s by default).
    disconnectTimeout: config.command_timeout_ms,
    retryStrategy: (attempt) => Math.min(attempt * 100, MAX_RECONNECT_DELAY_MS),
    // A master demoted under us answers writes with READONLY: drop the connection and find the
    // current master (through the sentinels, or the same address once it is master again).
    reconnectOnError: (error) => error.message.startsWith('READONLY'),
    // The purge subscriber subscribes again itself on every 'ready' (purge-sync.ts), catching its
    // failures; ioredis's own resubscription rejects where nobody listens, and a reply slower than
    // command_timeout_ms would end the process as an unhandled rejection.
    autoResubscribe: false,
  };
  if (config.cluster !== undefined) {
    // Validation made every seed carry the same credentials and scheme.
    const seeds = config.cluster.map(parseRedisUrl);
    const { username, password, tls: secure } = seeds[0]!;
    const options: ClusterOptions = {
      enableOfflineQueue: false,
      redisOptions: { ...common, ...credentials(username, password), ...withTls(tls(secure)) },
      clusterRetryStrategy: (attempt) => Math.min(attempt * 100, MAX_RECONNECT_DELAY_MS),
    };
    return new Cluster(
      seeds.map(({ host, port }) => ({ host, port })),
      options,
    );
  }
  if (config.sentinels !== undefined) {
    return new Redis({
      ...common,
      ...credentials(config.username, config.password),
      sentinels: config.sentinels.map((address) => {
        const i = address.lastIndexOf(':');
        return { host: address.slice(0, i), port: Number(address.slice(i + 1)) };
      }),
      name: config.name,
      ...(config.sentinel_username === undefined ? {} : { sentinelUsername: config.sentinel_username }),
      ...(config.sentinel_password === undefined ? {} : { sentinelPassword: config.sentinel_password }),
      ...withTls(tls(config.tls)),
      enableTLSForSentinelMode: config.tls === true,
      ...(config.sentinel_tls === true ? { sentinelTLS: tls(true) } : {}),
      // Without it a frozen or partitioned master is never left: the open connection to it stays
      // put (commands time out) and it is written to again when it resumes, until it is demoted.
      // The detector subscribes to +switch-master on the sentinels and reconnects on a switch.
      failoverDetector: true,
      sentinelReconnectStrategy: () => SENTINEL_RECONNECT_MS,
      sentinelCommandTimeout: Math.max(1000, config.command_timeout_ms),
    });
  }
  const node = parseRedisUrl(config.url!);
  return new Redis({ ...common, host: node.host, port: node.port, ...credentials(node.username, node.password), db: node.db ?? 0, ...withTls(tls(node.tls)) });
}

/** A validated `redis://` or `rediss://` URL; user and password are percent-decoded. */
export function parseRedisUrl(value: string): NodeAddress {
  const url = new URL(value);
  const db = url.pathname.replace(/^\//, '');
  return {
    // WHATWG URL keeps the brackets of an IPv6 host; sockets want the bare address.
    host: url.hostname.replace(/^\[(.*)\]$/, '$1'),
    port: Number(url.port || 6379),
    ...(url.username === '' ? {} : { username: decodeURIComponent(url.username) }),
    ...(url.password === '' ? {} : { password: decodeURIComponent(url.password) }),
    ...(db === '' ? {} : { db: Number(db) }),
    tls: url.protocol === 'rediss:',
  };
}

function credentials(username: string | undefined, password: string | undefined): Pick<RedisOptions, 'username' | 'password'> {
  return { ...(username === undefined ? {} : { username }), ...(password === undefined ? {} : { password }) };
}

function withTls(options: ConnectionOptions | undefined): Pick<RedisOptions, 'tls'> {
  return options === undefined ? {} : { tls: options };
}

function readCa(file: string, key: string): Buffer {
  try {
    return readFileSync(file);
  } catch (error) {
    throw new Error(`${key}: cannot read ${file} (${(error as NodeJS.ErrnoException).code ?? 'unknown error'})`);
  }
}
