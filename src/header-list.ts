/**
 * Extra headers for one response, as a flat [name, value, name, value, ...] list: the cheapest
 * form node:http's `writeHead` accepts. A type of its own so that modules below the server
 * (rate-limit headers) can build one without depending on the server.
 */
export type HeaderList = (string | number)[];
