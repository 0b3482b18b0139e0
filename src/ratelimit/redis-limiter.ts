import type { RedisClient } from '../redis/redis-client.js';
import type { BucketLimiter, Plan, Verdict } from './token-bucket.js';

/**
 * `takeFrom` (token-bucket.ts) as one atomic script, so concurrent instances never both spend the
 * last token. The clock is Redis `TIME`, not the caller's: instances with skewed clocks would
 * otherwise refill the same bucket by different amounts. The hash lives only until the bucket
 * would be full again (an absent bucket is a full one), so idle keys cost no memory.
 * Numbers cross the Lua boundary as strings: Redis truncates Lua numbers in replies to integers.
 * One request takes `need` = `want` = its cost (0 or 1); a lease takes up to `want` whole tokens
 * as long as at least `need` = 1 is there.
 *
 * KEYS[1] bucket; ARGV capacity, tokens per millisecond, want, need. Returns allowed (0/1), the
 * tokens left and the tokens taken.
 */
const TAKE_SCRIPT = `
local capacity = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = capacity
else
  tokens = math.min(capacity, tokens + math.max(0, now - at) * per_ms)
end
local allowed = 0
local taken = 0
if tokens + 1e-9 >= need then
  allowed = 1
  taken = math.min(want, math.floor(tokens + 1e-9))
  tokens = math.max(0, tokens - taken)
end
local ms_to_full = math.ceil((capacity - tokens) / per_ms)
if ms_to_full <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%d', now))
  redis.call('PEXPIRE', KEYS[1], ms_to_full)
end
return {allowed, string.format('%.17g', tokens), taken}
`;

const COMMAND = 'perchTakeToken';

interface WithTakeCommand {
  [COMMAND](key: string, capacity: number, perMs: string, want: number, need: number): Promise<[number, string, number]>;
}

/** Buckets shared by every instance through one Redis; keys are `${prefix}rl:${keyId}`. */
export class RedisLimiter implements BucketLimiter {
  readonly #client: WithTakeCommand;
  readonly #prefix: string;
  readonly #timeoutMs: number;
  readonly #firstReady: Promise<void>;
  #everReady = false;
  #connectionFailed = false;

  constructor(client: RedisClient, options: { prefix: string; commandTimeoutMs: number }) {
    // defineCommand sends EVALSHA and falls back to EVAL when Redis does not know the script
    // (e.g. after a restart), so the script text crosses the wire only when needed.
    client.defineCommand(COMMAND, { numberOfKeys: 1, lua: TAKE_SCRIPT });
    this.#client = client as unknown as WithTakeCommand;
    this.#prefix = `${options.prefix}rl:`;
    this.#timeoutMs = options.commandTimeoutMs;
    this.#firstReady = new Promise((resolve) => client.once('ready', resolve)).then(() => void (this.#everReady = true));
    client.on('error', () => (this.#connectionFailed = true));
  }

  async take(keyId: string, plan: Plan, cost: 0 | 1): Promise<Verdict> {
    if (!this.#everReady && !this.#connectionFailed) await this.#awaitFirstConnection();
    const perMs = String(plan.refillPerSecond / 1000);
    const [allowed, tokens] = await this.#client[COMMAND](this.redisKey(keyId), plan.capacity, perMs, cost, cost);
    return { plan, allowed: allowed === 1, tokens: Number(tokens) };
  }

  /** Takes up to `want` whole tokens (none when not even one is there) and the tokens left after. */
  async lease(keyId: string, plan: Plan, want: number): Promise<{ taken: number; tokens: number }> {
    if (!this.#everReady && !this.#connectionFailed) await this.#awaitFirstConnection();
    const perMs = String(plan.refillPerSecond / 1000);
    const [, tokens, taken] = await this.#client[COMMAND](this.redisKey(keyId), plan.capacity, perMs, want, 1);
    return { taken, tokens: Number(tokens) };
  }

  /** The Redis key of a key's bucket: what decides which cluster node holds it. */
  redisKey(keyId: string): string {
    return this.#prefix + keyId;
  }

  /**
   * Without an offline queue, a command sent before the first connection is up fails at once.
   * Requests arriving right after start-up wait for that connection up to the command timeout,
   * as they would for a slow command, instead of reporting an outage that is not one.
   */
  async #awaitFirstConnection(): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => (timer = setTimeout(resolve, this.#timeoutMs)));
    await Promise.race([this.#firstReady, timeout]);
    clearTimeout(timer);
  }
}
