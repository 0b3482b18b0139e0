/**
 * `length` bytes copied into memory of their own. Bytes read from a socket or a Redis reply are
 * views into larger buffers; caching a view would pin the whole buffer for the entry's lifetime,
 * so RSS would drift far above what `max_bytes` counts.
 */
export function ownedBytes(chunks: readonly Buffer[], length: number): Buffer {
  const bytes = Buffer.allocUnsafeSlow(length);
  let offset = 0;
  for (const chunk of chunks) offset += chunk.copy(bytes, offset);
  return bytes;
}
