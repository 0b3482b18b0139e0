import { readFileSync } from 'node:fs';

/**
 * perch's version, from the package.json shipped next to the build (dist/src/ -> ../../). Read
 * at run time rather than compiled in, so the version in `--version`, the first log line and
 * `perch_build_info` is always the one of the package that is running.
 */
export const PERCH_VERSION: string = readVersion();

function readVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: unknown };
    return typeof pkg.version === 'string' ? pkg.version : 'unknown';
  } catch {
    // A build copied without its package.json still runs; it just cannot say which it is.
    return 'unknown';
  }
}
