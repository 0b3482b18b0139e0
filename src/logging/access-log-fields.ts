/**
 * Bounds on what a client controls in the access line: a head may be up to
 * `server.max_header_bytes`, and a log line that size per request would cost more than serving it.
 */
const MAX_LOGGED_CHARS = 256;

/**
 * The request target as logged: a cursor's value (opaque, up to 1024 bytes, and of no use
 * in a log) becomes `-`, and the rest is clipped, so a line stays short whatever the client sent.
 */
export function loggedPath(target: string | undefined): string | null {
  if (target === undefined) return null;
  const withoutCursor = target.includes('cursor=') ? target.replace(/([?&]cursor=)[^&]*/g, '$1-') : target;
  return clip(withoutCursor);
}

/** `text` cut to at most MAX_LOGGED_CHARS characters and marked as cut. */
export function clip(text: string | undefined): string | null {
  if (text === undefined) return null;
  return text.length > MAX_LOGGED_CHARS ? `${text.slice(0, MAX_LOGGED_CHARS)}...` : text;
}
