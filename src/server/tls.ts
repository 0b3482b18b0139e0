import { readFileSync } from 'node:fs';
import type { TlsConfig } from '../config/types.js';

/**
 * Reads the certificate and key named by `server.tls`. Read once at start-up: a renewed
 * certificate takes a restart, which `drain` makes free of dropped requests.
 */
export function readTlsFiles(config: TlsConfig): { cert: Buffer; key: Buffer } {
  return { cert: read(config.cert_file, 'server.tls.cert_file'), key: read(config.key_file, 'server.tls.key_file') };
}

function read(path: string, key: string): Buffer {
  try {
    return readFileSync(path);
  } catch (error) {
    // The path is the operator's; the content (a private key) never goes into a message.
    throw new Error(`${key}: cannot read ${path} (${(error as NodeJS.ErrnoException).code ?? 'unknown error'})`);
  }
}
