/** The oldest Node perch runs on, as package.json's `engines` says: `process.execve` came in 22.19. */
export const REQUIRED_NODE = [22, 19] as const;

/**
 * What to tell the operator when `version` (`process.version`) is older than REQUIRED_NODE, or
 * undefined. Without this check an older Node fails far from the cause (`process.execve is not
 * a function`, then a crash inside undici) while `--check-config` calls the configuration valid.
 */
export function nodeVersionProblem(version: string): string | undefined {
  const [major = 0, minor = 0] = version.replace(/^v/, '').split('.').map(Number);
  const [needMajor, needMinor] = REQUIRED_NODE;
  if (major > needMajor || (major === needMajor && minor >= needMinor)) return undefined;
  return `perch needs Node ${needMajor}.${needMinor} or later; this is ${version}`;
}
