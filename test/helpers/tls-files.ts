import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { promisify } from 'node:util';
import type { TestTlsFiles } from './redis-server.js';
import { onCleanup } from './cleanup.js';

/**
 * A self-signed certificate for 127.0.0.1 and its key, made with openssl in a temporary directory
 * removed when the test ends. The certificate is its own CA: clients trust it as `tls_ca_file`.
 */
export async function selfSignedCertificate(t: TestContext): Promise<TestTlsFiles & { readonly dir: string }> {
  const dir = await mkdtemp(join(tmpdir(), 'perch-redis-tls-'));
  onCleanup(t, () => rm(dir, { recursive: true, force: true }));
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  await promisify(execFile)('openssl', [
    'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '1',
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1',
  ]);
  return { cert, key, dir };
}
