import assert from 'node:assert/strict';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { test, type TestContext } from 'node:test';
import { createAccessLog, type AccessFields } from '../src/logging/access-log.js';
import { LineBatcher, PIPE_BUF, wholeLines } from '../src/logging/line-batcher.js';
import { waitFor } from './helpers/perch.js';
import { createLogger } from '../src/logging/logger.js';
import { onCleanup } from './helpers/cleanup.js';

const FIELDS: AccessFields = {
  req_id: 'id-1',
  method: 'GET',
  path: '/v1/users/1?x="quoted"\\',
  route: 'user',
  status: 200,
  cache: 'hit',
  upstream: null,
  upstream_ms: null,
  upstream_call: false,
  batch: 3,
  ms: 0.12,
  key_id: 'alpha',
  remote: '127.0.0.1',
  user_agent: 'agent \u2028 with "quotes" and \u0001',
  trace_id: '4bf92f3577b34da6a3ce929d0e0e4736',
  span_id: '00f067aa0ba902b7',
};

/** A logger writing into memory, with the clock frozen so two lines can be compared whole. */
function capture(format: { time: 'epoch_ms' | 'iso'; level_format: 'number' | 'label' }) {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(chunk.toString('utf8'));
      done();
    },
  });
  const logger = createLogger({ level: 'info', ...format }, sink);
  return { logger, lines };
}

for (const time of ['epoch_ms', 'iso'] as const) {
  for (const level_format of ['number', 'label'] as const) {
    test(`the access line is byte for byte what pino writes for the same fields (time ${time}, level ${level_format})`, { timeout: 5000 }, (t) => {
      t.mock.timers.enable({ apis: ['Date'], now: Date.UTC(2026, 0, 1, 12) });
      const { logger, lines } = capture({ time, level_format });
      logger.info({ ...FIELDS }, 'request');
      createAccessLog(logger)(FIELDS);
      assert.equal(lines.length, 2);
      assert.equal(lines[1], lines[0]);
      assert.deepEqual(JSON.parse(lines[1]!).user_agent, FIELDS.user_agent);
    });
  }
}

test('the access line follows the level: none below info, and again after a change', { timeout: 5000 }, () => {
  const { logger, lines } = capture({ time: 'epoch_ms', level_format: 'number' });
  const access = createAccessLog(logger);
  logger.level = 'warn';
  access(FIELDS);
  assert.equal(lines.length, 0);
  logger.level = 'info';
  access(FIELDS);
  assert.equal(lines.length, 1);
});

/** An empty file and its descriptor, both gone when the test ends. */
function tempLogFile(t: TestContext): { file: string; fd: number } {
  const dir = mkdtempSync(join(tmpdir(), 'perch-lines-'));
  onCleanup(t, () => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, 'log');
  const fd = openSync(file, 'w');
  onCleanup(t, () => closeSync(fd));
  return { file, fd };
}

test('the line batcher writes every line, in order, once flushed', { timeout: 5000 }, async (t) => {
  const { file, fd } = tempLogFile(t);
  const batcher = new LineBatcher(fd);
  const expected: string[] = [];
  // Enough lines for several 64 KB batches, with a flush racing the writes in flight.
  for (let i = 0; i < 5000; i++) {
    const line = `{"n":${i},"pad":"${'x'.repeat(i % 50)}é"}\n`;
    expected.push(line);
    batcher.write(line);
  }
  await new Promise<void>((resolve) => batcher.flush(() => resolve()));
  assert.equal(readFileSync(file, 'utf8'), expected.join(''));
  batcher.write('{"last":true}\n');
  batcher.flushSync();
  assert.equal(readFileSync(file, 'utf8'), `${expected.join('')}{"last":true}\n`);
});

test('the line batcher writes lines within its delay without a flush, after a full batch too, and a line longer than a batch', { timeout: 5000 }, async (t) => {
  const { file, fd } = tempLogFile(t);
  const batcher = new LineBatcher(fd);
  let expected = '';
  const write = (line: string): void => {
    expected += line;
    batcher.write(line);
  };
  write('{"first":1}\n');
  await waitFor(() => readFileSync(file, 'utf8') === expected);
  // A full batch goes out at once; the two lines after it only by the timer.
  for (let i = 0; i < 400; i++) write(`{"n":${i},"pad":"${'y'.repeat(200)}"}\n`);
  write('{"after":1}\n');
  write(`{"long":"${'z'.repeat(100_000)}"}\n`);
  write('{"after":2}\n');
  await waitFor(() => readFileSync(file, 'utf8') === expected);
});

test('the line batcher writes a batch that a long line ended at once, not at its timer', { timeout: 5000 }, async (t) => {
  const { file, fd } = tempLogFile(t);
  const batcher = new LineBatcher(fd);
  // The timer never fires: what reaches the file was written because a batch ended.
  t.mock.timers.enable({ apis: ['setTimeout'] });
  // 400-character lines: the next line's room check (3 bytes per character) ends each batch
  // before the batch is full, which is the way an access line with a user agent ends them.
  const line = `{"pad":"${'y'.repeat(389)}"}\n`;
  assert.equal(line.length, 400);
  const lines = 170;
  for (let i = 0; i < lines; i++) batcher.write(line);
  const firstBatch = Math.floor((64 * 1024 - 3 * line.length) / line.length + 1) * line.length;
  const deadline = performance.now() + 4000;
  while (statSync(file).size < firstBatch && performance.now() < deadline) await new Promise((resolve) => setImmediate(resolve));
  assert.equal(statSync(file).size, firstBatch);
  t.mock.timers.reset();
  await new Promise<void>((resolve) => batcher.flush(() => resolve()));
  assert.equal(statSync(file).size, lines * line.length);
});

test('wholeLines cuts batches into whole lines of at most PIPE_BUF bytes; a longer line goes alone', { timeout: 5000 }, () => {
  const long = `${'y'.repeat(5000)}\n`;
  const lines = Array.from({ length: 40 }, (_, i) => `{"n":${i},"pad":"${'x'.repeat(300)}"}\n`);
  const batch = Buffer.from(lines.join('') + long + lines.slice(0, 3).join(''));
  const pieces = wholeLines([batch, Buffer.from(lines[0]!)], PIPE_BUF);
  assert.equal(Buffer.concat(pieces).toString(), batch.toString() + lines[0]);
  for (const piece of pieces) {
    assert.equal(piece.at(-1), 0x0a, 'each piece ends a line');
    if (piece.length > PIPE_BUF) assert.equal(piece.toString(), long);
  }
  assert.deepEqual(
    pieces.map((p) => p.length),
    // Lines of 317 and 318 bytes: twelve to a piece, then the rest before the long line.
    [3806, 3816, 3816, 1272, 5001, 951, 317],
  );
});

test('the line batcher with atomicLines writes every line, in order, in writes of whole lines', { timeout: 5000 }, async (t) => {
  const { file, fd } = tempLogFile(t);
  const batcher = new LineBatcher(fd, { atomicLines: true });
  const expected: string[] = [];
  for (let i = 0; i < 5000; i++) {
    const line = `{"n":${i},"pad":"${'x'.repeat(i % 50)}é"}\n`;
    expected.push(line);
    batcher.write(line);
  }
  batcher.write(`${'z'.repeat(9000)}\n`);
  await new Promise<void>((resolve) => batcher.flush(() => resolve()));
  assert.equal(readFileSync(file, 'utf8'), `${expected.join('')}${'z'.repeat(9000)}\n`);
});
