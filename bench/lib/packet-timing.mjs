// Request latencies read off the wire: tcpdump records the loopback packets of one server port
// while wrk loads it, and each request's latency is the time from its segment to the last segment
// of its answer, as the kernel stamped them. wrk's own percentiles at saturation are partly
// inferred: after the run it adds synthetic samples for every answer slower than twice a
// connection's mean interval (stats_correct), as if that connection had kept sending at the
// saturated rate meanwhile. At the start of a run that inference dominates: libuv accepts one
// connection per turn of the event loop (libuv PR #3696), so a server already busy with the first
// connections admits the 64th after some 60 turns, and the first answers on the last connections
// take tens of milliseconds (bench/RESULTS.md, "Hit tail from packets"). The packets say what each
// request actually waited, and when each connection got its first answer.
//
// The capture costs CPU on both cores (the kernel copies every loopback packet to tcpdump on the
// CPU that sends it), the same per packet for every server measured; tcpdump itself is pinned to
// the client CPU, and its share counts as the generator's.
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { cpuSplitOf, sleep, start } from './procs.mjs';

const TCPDUMP = ['/usr/bin/tcpdump', '/usr/sbin/tcpdump'].find((path) => existsSync(path)) ?? null;

/** tcpdump's path, or null when it is not installed (bench/setup.sh installs it). */
export function tcpdumpPath() {
  return TCPDUMP;
}

/**
 * Starts recording the TCP packets of `port` on the loopback interface into `file` (only their
 * first 128 bytes: the headers and the start of each payload), tcpdump pinned to `cpu`.
 * Resolves once tcpdump listens, with `stop()`, which ends the capture and resolves with the CPU
 * seconds tcpdump used and the packets the kernel dropped (any drop leaves requests unmatched).
 */
export async function capturePackets({ port, file, cpu = null }) {
  if (TCPDUMP === null) throw new Error('tcpdump is not installed (bench/setup.sh installs it)');
  const proc = start('tcpdump', TCPDUMP, ['-i', 'lo', '-n', '-s', '128', '-B', '65536', '-w', file, `tcp port ${port}`], { cpu, stdout: 'ignore' });
  const deadline = Date.now() + 10_000;
  while (!proc.stderr().includes('listening on')) {
    if (!proc.alive() || Date.now() > deadline) {
      await proc.stop();
      throw new Error(`tcpdump did not start listening: ${proc.stderr().trim()}`);
    }
    await sleep(20);
  }
  return {
    async stop() {
      const { user, system } = cpuSplitOf(proc.pid);
      proc.child.kill('SIGINT');
      await proc.exited;
      const dropped = Number(/(\d+) packets? dropped by kernel/.exec(proc.stderr())?.[1] ?? NaN);
      return { cpuSeconds: user + system, dropped };
    },
  };
}

/**
 * The requests in the pcap `file` (classic format, Ethernet framing as Linux gives loopback) on
 * server `port`, with one request in flight per connection (wrk's way): each request's latency in
 * ms, from its first segment to the last segment of the answer before the connection's next
 * request; and per connection, when its first answer ended, in ms after the first SYN of the
 * capture. Deletes the file.
 */
export function requestsFromPcap(file, port) {
  const b = readFileSync(file);
  rmSync(file, { force: true });
  if (b.length < 24 || b.readUInt32LE(0) !== 0xa1b2c3d4) throw new Error(`${file}: not a microsecond pcap file`);
  const linkType = b.readUInt32LE(20);
  if (linkType !== 1) throw new Error(`${file}: link type ${linkType}, expected Ethernet (1)`);
  const connections = new Map();
  const latencies = [];
  let firstSyn = null;
  const finish = (c) => {
    if (c.requestAt !== null && c.answerEnd !== null) latencies.push(c.answerEnd - c.requestAt);
  };
  for (let off = 24; off + 16 <= b.length; ) {
    const t = b.readUInt32LE(off) * 1000 + b.readUInt32LE(off + 4) / 1000;
    const captured = b.readUInt32LE(off + 8);
    const frame = off + 16;
    off = frame + captured;
    const ip = frame + 14;
    if (b.readUInt16BE(frame + 12) !== 0x0800 || b[ip] >> 4 !== 4) continue;
    const ipHeader = (b[ip] & 15) * 4;
    const tcp = ip + ipHeader;
    const payload = b.readUInt16BE(ip + 2) - ipHeader - (b[tcp + 12] >> 4) * 4;
    const source = b.readUInt16BE(tcp);
    const toServer = b.readUInt16BE(tcp + 2) === port;
    const client = toServer ? source : b.readUInt16BE(tcp + 2);
    const syn = (b[tcp + 13] & 0x12) === 0x02;
    if (syn && toServer) {
      firstSyn ??= t;
      // A port used again: the connection that had it is over.
      const before = connections.get(client);
      if (before !== undefined) finish(before);
      connections.set(client, { requestAt: null, answerEnd: null, firstAnswer: null });
      continue;
    }
    const c = connections.get(client);
    if (c === undefined || payload <= 0) continue;
    if (toServer) {
      // A segment after an answer is the next request; one before it, the rest of this one.
      if (c.requestAt === null || c.answerEnd !== null) {
        finish(c);
        c.requestAt = t;
        c.answerEnd = null;
      }
    } else if (c.requestAt !== null) {
      c.answerEnd = t;
      if (c.firstAnswer === null) c.firstAnswer = t;
    }
  }
  for (const c of connections.values()) finish(c);
  const firstAnswers = [...connections.values()].filter((c) => c.firstAnswer !== null).map((c) => c.firstAnswer - firstSyn);
  return { latencies, firstAnswers };
}
