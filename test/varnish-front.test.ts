import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { gunzipSync } from 'node:zlib';
import { request } from 'undici';
import { onCleanup } from './helpers/cleanup.js';
import { KEY, pollFor, startPerch, testConfig } from './helpers/perch.js';

/** Debian's varnishd, which .ci/run installs and then requires (PERCH_REQUIRE_VARNISH). */
const VARNISHD = ['/usr/sbin/varnishd', '/usr/bin/varnishd'].find((path) => spawnSync(path, ['-V']).status === 0);
const PAGE = '/v1/users/12/tweets';
const T = { timeout: 60_000 };

function skipWithoutVarnish(t: TestContext): boolean {
  if (VARNISHD !== undefined) return false;
  assert.notEqual(process.env.PERCH_REQUIRE_VARNISH, '1', 'varnishd is required but not installed');
  t.skip('varnishd is not installed (Debian package "varnish"; .ci/run installs it)');
  return true;
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/**
 * varnishd in the foreground in its own process group (manager and cache child both go with
 * it), its working dir in a temp dir; `vcl` undefined: the stock builtin VCL in front of
 * `backendPort` (-b), else that VCL.
 */
async function startVarnish(t: TestContext, backendPort: number, vcl?: string): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'perch-varnish-'));
  const port = await freePort();
  const args = ['-F', '-j', 'none', '-n', join(dir, 'work'), '-a', `127.0.0.1:${port}`, '-T', 'none', '-s', 'malloc,16m', '-p', 'thread_pools=1'];
  if (vcl === undefined) args.push('-b', `127.0.0.1:${backendPort}`);
  else {
    writeFileSync(join(dir, 'test.vcl'), vcl);
    args.push('-f', join(dir, 'test.vcl'));
  }
  const proc = spawn(VARNISHD!, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let output = '';
  proc.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  proc.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  onCleanup(t, async () => {
    try {
      process.kill(-proc.pid!, 'SIGKILL');
    } catch {
      // Already gone.
    }
    await exited;
    rmSync(dir, { recursive: true, force: true });
  });
  const url = `http://127.0.0.1:${port}`;
  // The VCL is compiled with cc first: wait until it answers.
  await pollFor(
    async () => {
      if (proc.exitCode !== null) throw new Error(`varnishd exited: ${output}`);
      try {
        const res = await request(`${url}/healthz`);
        await res.body.dump();
        return true;
      } catch {
        return undefined;
      }
    },
    30_000,
    50,
  );
  return url;
}

async function get(url: string, headers: Record<string, string>) {
  const res = await request(url + PAGE, { headers: { 'x-api-key': KEY, ...headers } });
  return { headers: res.headers as Record<string, string | undefined>, body: Buffer.from(await res.body.arrayBuffer()) };
}

/** What a client ends up with: the body decoded as its Content-Encoding says. */
function decoded(res: { headers: Record<string, string | undefined>; body: Buffer }): Buffer {
  return res.headers['content-encoding'] === 'gzip' ? gunzipSync(res.body) : res.body;
}

for (const [name, vcl] of [
  ['a stock Varnish (builtin VCL: perch\'s private answers pass)', undefined],
  ['a Varnish told to cache every 200 per URL and key, Vary and all', 'caching'],
] as const) {
  test(`through ${name}, a gzip client and an identity client each get the right bytes`, T, async (t) => {
    if (skipWithoutVarnish(t)) return;
    const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
    const port = Number(new URL(perch.url).port);
    const front = await startVarnish(
      t,
      port,
      vcl === undefined
        ? undefined
        : `vcl 4.1;
backend perch { .host = "127.0.0.1"; .port = "${port}"; }
sub vcl_hash { hash_data(req.url); hash_data(req.http.X-API-Key); return (lookup); }
sub vcl_backend_response { if (beresp.status == 200) { set beresp.ttl = 1h; return (deliver); } }
sub vcl_deliver { if (obj.hits > 0) { set resp.http.X-Hit = "1"; } }
`,
    );
    const identity = (await perch.request(PAGE)).text;
    for (let round = 0; round < 3; round++) {
      const gz = await get(front, { 'accept-encoding': 'gzip' });
      const plain = await get(front, {});
      assert.equal(plain.headers['content-encoding'], undefined, 'an identity client never gets a coded body');
      assert.equal(plain.body.toString(), identity);
      assert.equal(decoded(gz).toString(), identity);
      assert.equal(gz.headers['content-encoding'], 'gzip', 'perch had the gzip variant, and Varnish passed or kept it');
      if (vcl !== undefined && round > 0) assert.equal(plain.headers['x-hit'], '1', 'Varnish answered from its cache');
    }
  });
}
