import { promisify } from 'node:util';
import { brotliCompress, brotliCompressSync, brotliDecompress, constants, gunzip, gzip, gzipSync, type BrotliOptions, type ZlibOptions } from 'node:zlib';
import { ownedBytes } from '../bytes.js';
import type { CompressionConfig } from '../config/types.js';
import type { ContentCoding, Variants } from './entry.js';

/**
 * Brotli's quality for stored variants. Node's default, 11, costs about 10 ms per 10 KB page; 4
 * costs about 0.17 ms on this machine and keeps 90-95% of 11's savings on JSON pages.
 */
export const BROTLI_QUALITY = 4;
/** zlib's own default level: 0.11 ms per 10 KB page; level 9 saves 2% more for 10% more CPU. */
export const GZIP_LEVEL = 6;

const compressBrotli = promisify<Buffer, BrotliOptions, Buffer>(brotliCompress);
const compressGzip = promisify<Buffer, ZlibOptions, Buffer>(gzip);
const decompressBrotli = promisify<Buffer, BrotliOptions, Buffer>(brotliDecompress);
const decompressGzip = promisify<Buffer, ZlibOptions, Buffer>(gunzip);

/** Whether `body` gets compressed variants at all under `settings`. */
export function compressible(body: Buffer, settings: CompressionConfig): boolean {
  return (settings.brotli || settings.gzip) && body.length >= settings.min_bytes;
}

/**
 * Bodies up to this size are compressed on the event loop, after the answer is written; larger
 * ones on libuv's thread pool. node:zlib's asynchronous calls cost about twice the CPU of the
 * synchronous ones for a 10 KB page (0.33 ms against 0.16 ms for both variants, measured), and
 * where perch has one core the pool's threads take it from the loop anyway; past 64 KiB (about
 * 1 ms of work) a stall of the loop would cost the requests waiting on it more than the hop.
 */
const ON_LOOP_MAX_BYTES = 65_536;

/**
 * Windows no larger than the body: brotli's default window is 4 MiB and deflate's state about
 * 256 KiB, allocated and freed on every call, which for a 10 KB page costs more than compressing
 * it. The output is the same format; a window at least as large as the body loses nothing.
 */
const windowBits = (body: Buffer, min: number, max: number) => Math.min(max, Math.max(min, Math.ceil(Math.log2(body.length + 1))));

/**
 * zlib's output buffer: the body's size, which a variant worth keeping never reaches, where the
 * default is 16 KiB for every call. It is allocated outside V8's heap on each call, and for a
 * ~1.5 KB user was ten times what the variant needed.
 */
const chunkSize = (body: Buffer) => Math.max(constants.Z_MIN_CHUNK, body.length);

const brotliOptions = (body: Buffer): BrotliOptions => ({
  chunkSize: chunkSize(body),
  params: {
    [constants.BROTLI_PARAM_QUALITY]: BROTLI_QUALITY,
    [constants.BROTLI_PARAM_MODE]: constants.BROTLI_MODE_TEXT,
    [constants.BROTLI_PARAM_SIZE_HINT]: body.length,
    [constants.BROTLI_PARAM_LGWIN]: windowBits(body, constants.BROTLI_MIN_WINDOW_BITS, constants.BROTLI_DEFAULT_WINDOW),
  },
});

const gzipOptions = (body: Buffer): ZlibOptions => ({ level: GZIP_LEVEL, windowBits: windowBits(body, 9, 15), memLevel: 8, chunkSize: chunkSize(body) });

/**
 * The variants `settings` asks for, made after the current answer has been written (see
 * ON_LOOP_MAX_BYTES for where); undefined where none is kept. A coding whose compression fails,
 * or which saves nothing, is left out: the identity body then serves those clients.
 */
export async function encode(body: Buffer, settings: CompressionConfig): Promise<Variants | undefined> {
  if (!compressible(body, settings)) return undefined;
  let br: Buffer | undefined;
  let gz: Buffer | undefined;
  if (body.length <= ON_LOOP_MAX_BYTES) {
    // setImmediate: after the I/O of this turn, so the miss that stored the entry is answered first.
    await new Promise((resolve) => setImmediate(resolve));
    br = settings.brotli ? attempt(() => brotliCompressSync(body, brotliOptions(body))) : undefined;
    gz = settings.gzip ? attempt(() => gzipSync(body, gzipOptions(body))) : undefined;
  } else {
    [br, gz] = await Promise.all([
      settings.brotli ? compressBrotli(body, brotliOptions(body)).catch(() => undefined) : undefined,
      settings.gzip ? compressGzip(body, gzipOptions(body)).catch(() => undefined) : undefined,
    ]);
  }
  return packed(smaller(br, body), smaller(gz, body));
}

function attempt(compress: () => Buffer): Buffer | undefined {
  try {
    return compress();
  } catch {
    return undefined;
  }
}

function smaller(bytes: Buffer | undefined, body: Buffer): Buffer | undefined {
  return bytes !== undefined && bytes.length < body.length ? bytes : undefined;
}

/**
 * The variants copied into one allocation of their own. zlib hands back views
 * into its 16 KB output chunk, so a copy keeps the entry from pinning that; one copy for both,
 * because every Buffer allocated on its own costs an ArrayBuffer object in the heap and a
 * backing-store record outside it besides its bytes (issue 22). The identity body keeps its own:
 * packing it too meant copying it once more per miss, and on Node 20 RSS after a fill of 10 KB
 * pages rose instead of falling (the copies left for the GC are the likely cause, not verified;
 * docs/performance.md, Memory and the heap).
 */
function packed(br: Buffer | undefined, gzip: Buffer | undefined): Variants | undefined {
  const brBytes = br?.length ?? 0;
  const gzipBytes = gzip?.length ?? 0;
  if (brBytes + gzipBytes === 0) return undefined;
  return { bytes: ownedBytes([br, gzip].filter((b) => b !== undefined), brBytes + gzipBytes), brBytes, gzipBytes };
}

/**
 * The identity bytes of a stored variant, at most `length` of them: a value that inflates past
 * the length it was stored with is not what perch wrote, and is refused rather than trusted.
 * Rejects on corrupt input; the caller treats that as a miss.
 */
export async function decode(coding: ContentCoding, bytes: Buffer, length: number): Promise<Buffer> {
  const options = { maxOutputLength: Math.max(1, length) };
  const body = coding === 'br' ? await decompressBrotli(bytes, options) : await decompressGzip(bytes, options);
  if (body.length !== length) throw new Error(`a stored ${coding} variant inflated to ${body.length} bytes, not ${length}`);
  return ownedBytes([body], body.length);
}
