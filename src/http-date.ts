/**
 * HTTP-date (RFC 9110 5.6.7): what a recipient must accept, and nothing else. `Date.parse` reads
 * far more ("3000", "2027", "x 2030", "1.5"), each of which would be taken for a date.
 */

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const DAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const LONG_DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];
const MONTH = '(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)';
const TIME = '([0-9]{2}):([0-9]{2}):([0-9]{2})';
/** `Sun, 06 Nov 1994 08:49:37 GMT`: the form to send. */
const IMF_FIXDATE = new RegExp(`^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{2}) ${MONTH} ([0-9]{4}) ${TIME} GMT$`);
/** `Sunday, 06-Nov-94 08:49:37 GMT`: obsolete, accepted. */
const RFC850 = new RegExp(`^(Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), ([0-9]{2})-${MONTH}-([0-9]{2}) ${TIME} GMT$`);
/** `Sun Nov  6 08:49:37 1994`: C's asctime, obsolete, accepted (GMT, though it says no zone). */
const ASCTIME = new RegExp(`^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) ${MONTH} ([ 0-9][0-9]) ${TIME} ([0-9]{4})$`);

/** An IMF-fixdate as epoch ms; undefined for anything else. */
export function parseImfFixdate(text: string): number | undefined {
  const m = IMF_FIXDATE.exec(text);
  return m === null ? undefined : exact(DAYS.indexOf(m[1]!), Number(m[4]), MONTHS.indexOf(m[3]!), Number(m[2]), m[5]!, m[6]!, m[7]!);
}

/**
 * Any of the three HTTP-date forms as epoch ms; undefined for anything else, a date that does not
 * exist (31 Feb, 24:00) or a weekday that is not the date's. An rfc850 two-digit year more than
 * 50 years ahead of `nowMs` is the latest past year with those digits, as the RFC says.
 */
export function parseHttpDate(text: string, nowMs: number): number | undefined {
  const trimmed = text.trim();
  const imf = parseImfFixdate(trimmed);
  if (imf !== undefined) return imf;
  const rfc850 = RFC850.exec(trimmed);
  if (rfc850 !== null) {
    const thisYear = new Date(nowMs).getUTCFullYear();
    let year = Math.floor(thisYear / 100) * 100 + Number(rfc850[4]);
    if (year > thisYear + 50) year -= 100;
    return exact(LONG_DAYS.indexOf(rfc850[1]!), year, MONTHS.indexOf(rfc850[3]!), Number(rfc850[2]), rfc850[5]!, rfc850[6]!, rfc850[7]!);
  }
  const asctime = ASCTIME.exec(trimmed);
  if (asctime !== null) return exact(DAYS.indexOf(asctime[1]!), Number(asctime[7]), MONTHS.indexOf(asctime[2]!), Number(asctime[3]!.trim()), asctime[4]!, asctime[5]!, asctime[6]!);
  return undefined;
}

function exact(weekday: number, year: number, month: number, day: number, hh: string, mm: string, ss: string): number | undefined {
  const [hour, minute, second] = [Number(hh), Number(mm), Number(ss)];
  const ms = Date.UTC(year, month, day, hour, minute, second);
  // Date.UTC rolls 31 Feb over into March and 24:00 into the next day: such a date is not one.
  const parsed = new Date(ms);
  const real =
    parsed.getUTCFullYear() === year && parsed.getUTCMonth() === month && parsed.getUTCDate() === day && parsed.getUTCHours() === hour && parsed.getUTCMinutes() === minute && parsed.getUTCSeconds() === second;
  return real && parsed.getUTCDay() === weekday ? ms : undefined;
}
