import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Dispatcher } from 'undici';
import { KeyStore } from '../auth/key-store.js';
import { MemoryStore } from '../cache/memory-store.js';
import { systemClock, type Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { Logger } from '../observability/logger.js';
import { UpstreamSet } from '../upstream/upstream-set.js';
import { createRequestHandler } from './request-handler.js';

export interface PerchOptions {
  readonly config: Config;
  readonly logger: Logger;
  /** Default: the system clock. */
  readonly clock?: Clock;
  /** Per-upstream undici dispatcher overrides, by upstream name. */
  readonly dispatchers?: Readonly<Record<string, Dispatcher>>;
}

export interface Perch {
  readonly server: Server;
  /** Binds `server.host:server.port` (port 0 picks one) and resolves with the address. */
  listen(): Promise<AddressInfo>;
  /** Stops accepting, lets in-flight requests finish, then releases upstream connections. */
  close(): Promise<void>;
}

/** Wires one perch instance from a validated config. Nothing here is global, so tests run many. */
export function createPerch(options: PerchOptions): Perch {
  const { config, logger } = options;
  const clock = options.clock ?? systemClock;
  const upstreams = new UpstreamSet(config, { clock, dispatchers: options.dispatchers });
  const handler = createRequestHandler({
    config,
    keys: new KeyStore(config.auth.keys),
    cache: new MemoryStore({ maxBytes: config.cache.memory.max_bytes, clock }),
    upstreams,
    clock,
    logger,
  });
  const server = createServer(handler);

  return {
    server,
    listen: () =>
      new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(config.server.port, config.server.host, () => {
          server.off('error', reject);
          resolve(server.address() as AddressInfo);
        });
      }),
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      await closed;
      await upstreams.close();
    },
  };
}
