/**
 * Every error perch answers with, in one table: code -> HTTP status -> message. The error table
 * of docs/errors.md is checked against this one by test/error-table.test.ts, so the two cannot
 * drift. Messages are the defaults; E400 and E404 carry a more precise message per case (see
 * `ERROR_MESSAGES`), which is why that page lists those variants too.
 */
export const ERROR_TABLE = {
  E400: { status: 400, message: 'Invalid request' },
  E401: { status: 401, message: 'Invalid API key' },
  E404: { status: 404, message: 'Not found' },
  E405: { status: 405, message: 'Method not allowed' },
  E408: { status: 408, message: 'Request timeout' },
  E417: { status: 417, message: 'Expectation failed' },
  E429: { status: 429, message: 'Rate limit exceeded. Please try again later.' },
  E431: { status: 431, message: 'Request header fields too large' },
  E500: { status: 500, message: 'Internal server error' },
  E502: { status: 502, message: 'Upstream error' },
  E503: { status: 503, message: 'Service unavailable' },
  E504: { status: 504, message: 'Upstream timeout' },
} as const satisfies Record<string, { status: number; message: string }>;

export type ErrorCode = keyof typeof ERROR_TABLE;

/** The fixed per-case messages beyond the defaults, so tests and docs/errors.md can name them. */
export const ERROR_MESSAGES = {
  userNotFound: 'User not found',
  tweetNotFound: 'Tweet not found',
  malformedRequest: 'Malformed HTTP request',
} as const;

/** The error body of the interface (section 7): `{"error":{"message":...,"code":...}}`. */
export function errorBody(code: ErrorCode, message: string = ERROR_TABLE[code].message): Buffer {
  return Buffer.from(JSON.stringify({ error: { message, code } }));
}
