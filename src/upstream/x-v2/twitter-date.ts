import { formatTwitterDate } from '../../schemas/twitter-date.js';
import { MappingError, string } from './read.js';

/** What X sends: RFC 3339 in UTC with milliseconds, `2018-10-10T20:19:24.000Z`. */
const ISO_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,3})?Z$/;

/** An X v2 `created_at` in the interface's v1 form, `Wed Oct 10 20:19:24 +0000 2018`. */
export function twitterDate(value: unknown, path: string): string {
  const text = string(value, path);
  const ms = Date.parse(text);
  if (!ISO_UTC.test(text) || Number.isNaN(ms)) throw new MappingError(`${path} must be an ISO 8601 UTC date-time`);
  return formatTwitterDate(Math.floor(ms / 1000));
}
