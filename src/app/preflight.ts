import { readFileSync } from 'node:fs';
import { X509Certificate } from 'node:crypto';
import { createSecureContext } from 'node:tls';
import { readTlsFiles } from '../server/tls.js';
import type { Config } from '../config/types.js';

/**
 * Reads every file a start-up with `config` reads (the TLS certificate and key, the Redis CA
 * files) and checks that Node accepts them, returning one problem per failure. `--check-config`
 * runs it so a config that validates also starts; messages name the key and the path, never the
 * content (a private key).
 */
export function checkStartupFiles(config: Config): string[] {
  const problems: string[] = [];
  // Every message below starts with its key path.
  const attempt = (load: () => void) => {
    try {
      load();
    } catch (error) {
      problems.push((error as Error).message);
    }
  };
  const tls = config.server.tls;
  if (tls !== undefined) {
    attempt(() => {
      const files = readTlsFiles(tls);
      try {
        createSecureContext(files);
      } catch (error) {
        // A file that is not PEM, or a key that does not belong to the certificate.
        throw new Error(`server.tls: the certificate and key are not usable (${(error as Error).message})`);
      }
    });
  }
  for (const [section, redis] of [
    ['cache.redis', config.cache.redis],
    ['rate_limits_redis', config.rate_limits_redis],
  ] as const) {
    const file = redis?.tls_ca_file;
    if (file === undefined) continue;
    const key = `${section}.tls_ca_file`;
    attempt(() => {
      let ca: Buffer;
      try {
        ca = readFileSync(file);
      } catch (error) {
        throw new Error(`${key}: cannot read ${file} (${(error as NodeJS.ErrnoException).code ?? 'unknown error'})`);
      }
      // createSecureContext accepts any bytes as a CA; parsing shows whether it is a certificate.
      try {
        new X509Certificate(ca);
      } catch {
        throw new Error(`${key}: ${file} holds no PEM certificate`);
      }
    });
  }
  return problems;
}
