/** The oldest Node perch runs on, as package.json's `engines` says: `process.execve` came in 22.19. */
export const REQUIRED_NODE = [22, 19] as const;

/**
 * Node 23 is a line of its own, older in part than 22.19: `process.execve` came to it in 23.11
 * (and to 22 in 22.15); 23.0 to 23.10 would fail as an older Node does.
 */
const REQUIRED_ON_23 = 11;

/**
 * What to tell the operator when `version` (`process.version`) is older than REQUIRED_NODE, or
 * undefined. Without this check an older Node fails far from the cause (`process.execve is not
 * a function`, then a crash inside undici) while `--check-config` calls the configuration valid.
 */
export function nodeVersionProblem(version: string): string | undefined {
  const [major = 0, minor = 0] = version.replace(/^v/, '').split('.').map(Number);
  const [needMajor, needMinor] = REQUIRED_NODE;
  if (major === 23) return minor >= REQUIRED_ON_23 ? undefined : `perch needs Node ${needMajor}.${needMinor} or later, and 23.${REQUIRED_ON_23} or later on Node 23; this is ${version}`;
  if (major > needMajor || (major === needMajor && minor >= needMinor)) return undefined;
  return `perch needs Node ${needMajor}.${needMinor} or later; this is ${version}`;
}
