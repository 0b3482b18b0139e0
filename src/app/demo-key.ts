import { createHash } from 'node:crypto';
import type { Config } from '../config/types.js';

/**
 * The key of config/perch.yaml, published in the README so a newcomer can curl perch at once.
 * perch recognizes it so it can print a ready curl line and warn loudly that a key anyone can
 * read is enabled.
 */
export const DEMO_KEY = 'perch-demo-key-do-not-use-in-production';

const DEMO_DIGEST = createHash('sha256').update(DEMO_KEY).digest('hex');

export function hasDemoKey(config: Config): boolean {
  return config.auth.keys.some((key) => key.secrets.some((secret) => secret.sha256 === DEMO_DIGEST));
}
