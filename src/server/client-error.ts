import { STATUS_CODES, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { ERROR_MESSAGES, ERROR_TABLE, errorBody, type ErrorCode } from '../errors/error-table.js';
import type { Logger } from '../logging/logger.js';
import type { ConnectionTracker } from './connection-tracker.js';
import type { HeaderList } from '../header-list.js';

/** How long a socket answered at the byte level may linger for the client to read and close. */
const LINGER_MS = 1000;

/**
 * A complete error response written straight to a socket, for the cases where Node has no
 * response object to offer: a request head it could not parse, a timeout, CONNECT. It has the
 * interface's shape like every other error, and closes the connection, since after a parse
 * error the rest of the byte stream cannot be trusted.
 */
export function writeSocketError(socket: Duplex, code: ErrorCode, headers: HeaderList = [], message?: string): void {
  const { status } = ERROR_TABLE[code];
  const body = errorBody(code, message);
  let head = `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${body.length}\r\n`;
  for (let i = 0; i < headers.length; i += 2) head += `${headers[i]}: ${headers[i + 1]}\r\n`;
  socket.end(`${head}cache-control: no-store\r\nconnection: close\r\n\r\n${body.toString()}`);
  // end() leaves the read side open until the client closes; a client that never does would
  // hold the connection (and a max_connections slot) for good.
  setTimeout(() => socket.destroy(), LINGER_MS).unref();
}

/** Node's errors for request heads and bodies it rejected, by the answer each deserves. */
function codeFor(error: NodeJS.ErrnoException): ErrorCode {
  switch (error.code) {
    case 'HPE_HEADER_OVERFLOW':
      return 'E431';
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return 'E408';
    default:
      return 'E400';
  }
}

/** Sockets whose error answer is written or waiting: the parser may report more errors after the first. */
const answering = new WeakSet<Socket>();

/**
 * The server's `clientError` handler: Node's default answers a bare status line with an empty
 * body. The answer is written only when no answer to the same request has begun: a broken
 * chunked body can arrive after perch already answered its head, and a second, unsolicited
 * response would be read as the answer to the client's next request. A malformed request
 * pipelined behind one whose body was all received is a later request: its answer waits until
 * the answers before it are sent, since a client reads answers in order and would take it for
 * theirs; if they are not all sent (the client left, or a shutdown ends the connection with them)
 * the connection closes without it. A timeout on a connection that sent nothing since its last
 * answer is closed without a word: no request, no answer.
 */
export function handleClientError(error: NodeJS.ErrnoException, socket: Socket, tracker: ConnectionTracker, logger: Logger): void {
  if (error.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy();
    return;
  }
  if (answering.has(socket)) return;
  const { req, res, receivedSinceIdle } = tracker.state(socket);
  const code = codeFor(error);
  if (code === 'E408' && !receivedSinceIdle) {
    socket.destroy();
    return;
  }
  const answer = () => {
    logger.debug({ code: error.code }, 'malformed request rejected');
    writeSocketError(socket, code, [], code === 'E400' ? ERROR_MESSAGES.malformedRequest : undefined);
  };
  if (res !== undefined && req?.complete === true && !res.writableFinished) {
    answering.add(socket);
    // The latest answer is sent last (Node sends pipelined answers in order), so once it is
    // sent every answer before it is too.
    res.once('close', () => (res.writableFinished && socket.writable ? answer() : socket.destroy()));
    return;
  }
  if (res?.headersSent === true) {
    socket.destroy();
    return;
  }
  answering.add(socket);
  // The handler still working on this request must not write into the answer below.
  if (res !== undefined) res.shouldKeepAlive = false;
  answer();
}

/**
 * CONNECT asks perch to become a tunnel, which it never is; Node hands such requests to a
 * `connect` listener or, without one, closes the socket without a word.
 */
export function refuseConnect(req: IncomingMessage, socket: Duplex): void {
  req.resume();
  writeSocketError(socket, 'E405', ['allow', 'GET, HEAD']);
}
