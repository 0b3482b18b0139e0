import { createConnection, createServer, type AddressInfo, type Socket } from 'node:net';
import type { TestContext } from 'node:test';
import { onCleanup } from './cleanup.js';

export interface TcpProxy {
  /** `redis://` URL of the proxy, for a client that should reach the target through it. */
  readonly url: string;
  /** Drops every connection through the proxy and refuses new ones: a network partition. */
  cut(): void;
  /** Lets connections through again. */
  restore(): void;
  /**
   * Holds every reply from the target (requests still go through) until `release`: a Redis
   * command's reply held in flight, to order it after something else. Returns how many reply
   * bytes are held so far, as a function.
   */
  hold(): () => number;
  /** Sends the held replies on, in order, and lets further ones through. */
  release(): void;
}

/**
 * A TCP relay on 127.0.0.1 in front of `targetPort`, for partitioning one client from a server
 * that others still reach. Closed, connections included, when the test ends.
 */
export async function startTcpProxy(t: TestContext, targetPort: number): Promise<TcpProxy> {
  const open = new Set<Socket>();
  let cut = false;
  /** Replies held while `hold` lasts, per client socket, in arrival order. */
  let held: Map<Socket, Buffer[]> | undefined;
  let heldBytes = 0;
  const server = createServer((client) => {
    if (cut) {
      client.destroy();
      return;
    }
    const upstream = createConnection({ host: '127.0.0.1', port: targetPort });
    for (const socket of [client, upstream]) {
      open.add(socket);
      socket.on('close', () => open.delete(socket));
      socket.on('error', () => {});
    }
    client.pipe(upstream);
    upstream.on('data', (chunk: Buffer) => {
      if (held === undefined) {
        client.write(chunk);
        return;
      }
      heldBytes += chunk.length;
      held.set(client, [...(held.get(client) ?? []), chunk]);
    });
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const dropAll = () => {
    for (const socket of open) socket.destroy();
  };
  onCleanup(t, () => {
    dropAll();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return {
    url: `redis://127.0.0.1:${(server.address() as AddressInfo).port}`,
    cut: () => {
      cut = true;
      dropAll();
    },
    restore: () => {
      cut = false;
    },
    hold: () => {
      held ??= new Map();
      return () => heldBytes;
    },
    release: () => {
      const replies = held;
      held = undefined;
      heldBytes = 0;
      for (const [client, chunks] of replies ?? []) for (const chunk of chunks) if (!client.destroyed) client.write(chunk);
    },
  };
}
