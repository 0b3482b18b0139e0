import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/** Where a connection stands: no request yet, between requests, or answering one. */
type State = 'silent' | 'idle' | 'busy';

/** One client connection as the tracker sees it. */
interface Connection {
  /** The TCP socket; destroying it ends the connection whatever runs on top. */
  readonly tcp: Socket;
  /** The socket HTTP runs on: `tcp` itself, or the TLS socket wrapped around it. */
  http: Socket;
  /** Requests received and not yet answered (more than one when pipelined). */
  inflight: number;
  /** The latest request and its response, for errors arriving while it is answered. */
  req?: IncomingMessage;
  res?: ServerResponse;
  /** `http.bytesRead` when the connection last became idle: more since means a head began. */
  readAtIdle: number;
  state: State;
  gone: boolean;
  /** TLS only: the peer address, the key of `#byPeer` (read once: it is gone after a close). */
  readonly peer?: string;
}

/**
 * What the cache needs to know of each request's lifetime: memory it hands out is not reused
 * while a request that may hold it is open (cache/grace-periods.ts).
 */
export interface RequestSpans {
  /** A request begins; the token goes back to `leave` when its response closes. */
  enter(): number;
  leave(token: number): void;
}

/**
 * A socket's connection, kept on the socket itself: the tracker reads it on every request, and a
 * property load there is cheaper than a WeakMap lookup (it showed in the hit path's profile).
 */
const CONNECTION = Symbol('perch.connection');
type TrackedSocket = Socket & { [CONNECTION]?: Connection };

/**
 * Keeps `server.max_connections` without locking clients out. Node's own `maxConnections`
 * refuses the newest connection, so a flood of connections that never send anything (or send
 * their head a byte at a time) keeps every real client out until they time out. Here the newest
 * is always admitted and, at the cap, the oldest connection that has never sent a request is
 * closed, else the longest-idle keep-alive one: both cost their client at most a reconnect.
 * Only when every connection is mid-request is the new one refused.
 *
 * It also knows, per socket, whether a request is being answered, which the client-error handler
 * needs, and applies draining: once `drain()` is called, every response says `Connection: close`.
 */
export class ConnectionTracker {
  readonly #max: number;
  readonly #tls: boolean;
  readonly #all = new Set<Connection>();
  // Sets iterate in insertion order: the first element is the oldest.
  readonly #silent = new Set<Connection>();
  /**
   * Idle connections, longest idle first. A connection stays in it while it answers its next
   * request (its state says so; it is skipped, and dropped when met at the cap) and moves to the
   * end when it is idle again: two Set operations per request, where moving it between an idle
   * and a busy set cost five.
   */
  readonly #idle = new Set<Connection>();
  /** TLS only: the HTTP socket is created after the TCP one, found again by its peer address. */
  readonly #byPeer = new Map<string, Connection>();
  #draining = false;
  readonly #spans: RequestSpans | undefined;

  constructor(maxConnections: number, tls: boolean, spans?: RequestSpans) {
    this.#max = maxConnections;
    this.#tls = tls;
    this.#spans = spans;
  }

  /** A new TCP connection (the server's `connection` event). */
  accept(tcp: Socket): void {
    if (this.#all.size >= this.#max) {
      const victim = first(this.#silent) ?? this.#longestIdle();
      if (victim === undefined) {
        tcp.destroy();
        return;
      }
      this.#forget(victim);
      victim.tcp.destroy();
    }
    const connection: Connection = { tcp, http: tcp, inflight: 0, readAtIdle: 0, state: 'silent', gone: false, ...(this.#tls ? { peer: peer(tcp) } : {}) };
    this.#all.add(connection);
    this.#silent.add(connection);
    (tcp as TrackedSocket)[CONNECTION] = connection;
    if (connection.peer !== undefined) this.#byPeer.set(connection.peer, connection);
    tcp.once('close', () => this.#forget(connection));
  }

  /** TLS only: the handshake finished; `tls` is the socket requests will arrive on. */
  secured(tls: Socket): void {
    const connection = this.#byPeer.get(peer(tls));
    if (connection === undefined) return;
    connection.http = tls;
    (tls as TrackedSocket)[CONNECTION] = connection;
  }

  /** A request arrived (`request` or `checkExpectation`). */
  request(req: IncomingMessage, res: ServerResponse): void {
    const connection = (req.socket as TrackedSocket)[CONNECTION];
    if (this.#draining) res.shouldKeepAlive = false;
    const spans = this.#spans;
    // Entered for every request: its close (or its connection's) is the one sure sign that
    // nothing of it still reads what the cache handed out. One listener serves both.
    const token = spans?.enter() ?? 0;
    if (connection === undefined) {
      if (spans !== undefined) leaveOnce(spans, token, res, req.socket);
      return;
    }
    if (connection.state === 'silent') this.#silent.delete(connection);
    connection.state = 'busy';
    connection.inflight++;
    connection.req = req;
    connection.res = res;
    // Node closes every response of a connection that goes, those still queued behind the
    // current one included, so the response's close is the one place a request leaves.
    res.once('close', () => {
      spans?.leave(token);
      this.#answered(connection);
    });
  }

  /**
   * The request being received or answered on `socket`, if any, so an error arriving meanwhile
   * can tell whether an answer has begun; and whether the client sent anything since it last
   * went idle (a timeout with nothing received deserves a close, not a 408).
   */
  state(socket: Socket): { req?: IncomingMessage; res?: ServerResponse; receivedSinceIdle: boolean } {
    const connection = (socket as TrackedSocket)[CONNECTION];
    if (connection === undefined) return { receivedSinceIdle: socket.bytesRead > 0 };
    const busy = connection.inflight > 0 || connection.req?.complete === false;
    return {
      ...(busy ? { req: connection.req, res: connection.res } : {}),
      receivedSinceIdle: connection.http.bytesRead > connection.readAtIdle,
    };
  }

  /**
   * From now on every response says `Connection: close`; responses not yet begun are switched
   * too, and connections whose answer already promised keep-alive are ended once it is sent.
   */
  drain(): void {
    this.#draining = true;
    for (const connection of this.#all) {
      if (connection.state === 'busy' && connection.res?.headersSent === false) connection.res.shouldKeepAlive = false;
    }
    this.closeIdle();
  }

  /**
   * Closes every connection not answering a request: idle keep-alive ones, and ones that never
   * sent a request (Node's `closeIdleConnections` leaves those open until their head times out).
   */
  closeIdle(): void {
    for (const set of [this.#silent, this.#idle]) {
      for (const connection of set) {
        if (connection.state === 'busy') continue;
        this.#forget(connection);
        connection.tcp.destroy();
      }
    }
  }

  #answered(connection: Connection): void {
    connection.inflight--;
    if (connection.inflight > 0 || connection.gone) return;
    if (this.#draining) {
      // The answer may have promised keep-alive before the drain began: end it ourselves.
      connection.http.end();
      return;
    }
    connection.state = 'idle';
    connection.readAtIdle = connection.http.bytesRead;
    this.#idle.delete(connection);
    this.#idle.add(connection);
  }

  /** The connection idle the longest; busy ones met on the way leave the set until idle again. */
  #longestIdle(): Connection | undefined {
    for (const connection of this.#idle) {
      if (connection.state === 'idle') return connection;
      this.#idle.delete(connection);
    }
    return undefined;
  }

  #forget(connection: Connection): void {
    if (connection.gone) return;
    connection.gone = true;
    this.#all.delete(connection);
    this.#silent.delete(connection);
    this.#idle.delete(connection);
    if (connection.peer !== undefined) this.#byPeer.delete(connection.peer);
  }
}

/** An untracked socket's request leaves at its response's close or its socket's, whichever is first. */
function leaveOnce(spans: RequestSpans, token: number, res: ServerResponse, socket: Socket): void {
  let left = false;
  const leave = () => {
    if (left) return;
    left = true;
    res.off('close', leave);
    socket.off('close', leave);
    spans.leave(token);
  };
  res.once('close', leave);
  socket.once('close', leave);
}

function first<T>(set: Set<T>): T | undefined {
  for (const item of set) return item;
  return undefined;
}

function peer(socket: Socket): string {
  return `${socket.remoteAddress}|${socket.remotePort}`;
}
