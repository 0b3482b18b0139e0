/** One row of the README's configuration table. */
export interface ReadmeRow {
  /** The key paths the row documents (one cell may name several). */
  readonly paths: readonly string[];
  /** The upstream kind the row is about, when its key cell says so (`(\`x_v2\`)`). */
  readonly kind?: string;
  readonly defaults: string;
  readonly meaning: string;
}

const KINDS = ['v1', 'x_v2', 'fixture'];

/**
 * The README's configuration table ("| key | default | meaning |"), read by the schema
 * generator for descriptions and by a test that holds it to the key table.
 */
export function readmeRows(readme: string): ReadmeRow[] {
  const start = readme.indexOf('| key | default | meaning |');
  if (start === -1) throw new Error('the README has no configuration table');
  const rows: ReadmeRow[] = [];
  for (const line of readme.slice(start).split('\n').slice(2)) {
    if (!line.startsWith('|')) break;
    // `\|` is a pipe inside a cell (`printf %s "$KEY" \| sha256sum`).
    const [keys = '', defaults = '', ...meaning] = line.slice(1, -1).split(/(?<!\\)\|/).map((cell) => cell.trim().replaceAll('\\|', '|'));
    const codes = [...keys.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
    const kind = codes.find((code) => KINDS.includes(code));
    rows.push({ paths: expand(codes.filter((code) => !KINDS.includes(code))), ...(kind === undefined ? {} : { kind }), defaults, meaning: meaning.join('|') });
  }
  return rows;
}

/**
 * "`a.b.c` / `.d`": a leading dot replaces as many trailing segments of the first path as it
 * has, so "`upstreams.<name>.quota.requests`, `.quota.per_seconds`" names both quota keys.
 */
function expand(codes: readonly string[]): string[] {
  const first = codes[0] ?? '';
  return codes.map((code) => {
    if (!code.startsWith('.')) return code;
    const segments = first.split('.');
    const replaced = code.slice(1).split('.');
    return [...segments.slice(0, segments.length - replaced.length), ...replaced].join('.');
  });
}

/** A key's meaning as the README states it, for `kind` when a row is about that kind only. */
export type Describe = (path: string, kind: string | undefined) => string | undefined;

/** Looks meanings up in `rows`: the row about `kind` first, else the row about every kind. */
export function describeFrom(rows: readonly ReadmeRow[]): Describe {
  return (path, kind) => {
    const about = rows.filter((row) => row.paths.includes(path));
    return (about.find((row) => row.kind !== undefined && row.kind === kind) ?? about.find((row) => row.kind === undefined))?.meaning;
  };
}
