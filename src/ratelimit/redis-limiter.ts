import type { RedisClient } from '../redis/redis-client.js';
import type { BucketLimiter, Plan, Verdict } from './token-bucket.js';

/**
 * `takeFrom` (token-bucket.ts) as one atomic script, so concurrent instances never both spend the
 * last token. The clock is Redis `TIME`, not the caller's: instances with skewed clocks would
 * otherwise refill the same bucket by different amounts. The hash lives only until the bucket
 * would be full again (an absent bucket is a full one) and its instances' entries have lapsed,
 * so idle keys cost no memory. Numbers cross the Lua boundary as strings: Redis truncates Lua
 * numbers in replies to integers.
 *
 * One request takes `need` = `want` = its cost (0 or 1). A lease takes up to `want` whole tokens
 * as long as at least `need` = 1 is there, and at most `tokens / (2 n)` of them (but never less
 * than `need`), `n` being the instances that leased from this bucket within their registration
 * (fields `i:<instance>` of the same hash, whose value is when the entry lapses, Redis time): so
 * the instances of a fleet together take about half of what the bucket holds at a time, and the
 * last tokens go one request at a time, to whichever instance has a request for them.
 * `give` unspent tokens come back first (up to capacity). `register` > 0 (re)registers the
 * instance for that many ms, 0 removes its entry (it stops), -1 leaves it as it is.
 *
 * KEYS[1] bucket; ARGV capacity, tokens per millisecond, want, need, give, instance, register.
 * Returns allowed (0/1), the tokens left and the tokens taken.
 */
const TAKE_SCRIPT = `
local capacity = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local give = tonumber(ARGV[5])
local me = 'i:' .. ARGV[6]
local register = tonumber(ARGV[7])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local state = redis.call('HGETALL', KEYS[1])
local tokens = nil
local at = nil
local fleet = 0
local live_until = now
for i = 1, #state, 2 do
  local field = state[i]
  if field == 'tokens' then
    tokens = tonumber(state[i + 1])
  elseif field == 'at' then
    at = tonumber(state[i + 1])
  elseif field ~= me then
    local lapses = tonumber(state[i + 1])
    if lapses > now then
      fleet = fleet + 1
      live_until = math.max(live_until, lapses)
    else
      redis.call('HDEL', KEYS[1], field)
    end
  end
end
if tokens == nil or at == nil then
  tokens = capacity
else
  tokens = math.min(capacity, tokens + math.max(0, now - at) * per_ms)
end
tokens = math.min(capacity, tokens + give)
if ARGV[6] ~= '' then
  if register > 0 then
    redis.call('HSET', KEYS[1], me, string.format('%d', now + register))
    live_until = math.max(live_until, now + register)
    fleet = fleet + 1
  elseif register == 0 then
    redis.call('HDEL', KEYS[1], me)
  else
    local mine = tonumber(redis.call('HGET', KEYS[1], me))
    if mine ~= nil and mine > now then live_until = math.max(live_until, mine) end
  end
end
local allowed = 0
local taken = 0
if tokens + 1e-9 >= need then
  allowed = 1
  local share = math.max(need, math.floor((tokens + 1e-9) / (2 * math.max(1, fleet))))
  taken = math.min(want, share, math.floor(tokens + 1e-9))
  tokens = math.max(0, tokens - taken)
end
local ms_to_full = math.ceil((capacity - tokens) / per_ms)
local keep = math.max(ms_to_full, live_until - now)
if keep <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%d', now))
  redis.call('PEXPIRE', KEYS[1], keep)
end
return {allowed, string.format('%.17g', tokens), taken}
`;

const COMMAND = 'perchTakeToken';

interface WithTakeCommand {
  [COMMAND](key: string, capacity: number, perMs: string, want: number, need: number, give: number, instance: string, register: number): Promise<[number, string, number]>;
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
    const [allowed, tokens] = await this.#client[COMMAND](this.redisKey(keyId), plan.capacity, perMs, cost, cost, 0, '', -1);
    return { plan, allowed: allowed === 1, tokens: Number(tokens) };
  }

  /**
   * Takes up to `want` whole tokens for `instance` (fewer when other instances lease too: see the
   * script) and the tokens left after, registering the instance as one that leases for
   * `registerMs`. `need` 1: a request waits for it, so it gets a token while one is there; 0: a
   * lease taken ahead, which gets nothing once the instance's share rounds to no token.
   */
  async lease(keyId: string, plan: Plan, want: number, need: 0 | 1, instance: string, registerMs: number): Promise<{ taken: number; tokens: number }> {
    if (!this.#everReady && !this.#connectionFailed) await this.#awaitFirstConnection();
    const perMs = String(plan.refillPerSecond / 1000);
    const [, tokens, taken] = await this.#client[COMMAND](this.redisKey(keyId), plan.capacity, perMs, want, need, 0, instance, registerMs);
    return { taken, tokens: Number(tokens) };
  }

  /**
   * Puts `tokens` unspent leased tokens back (up to capacity); `leaving`: the instance stops, so
   * it no longer counts among those that lease.
   */
  async giveBack(keyId: string, plan: Plan, tokens: number, instance: string, leaving: boolean): Promise<void> {
    const perMs = String(plan.refillPerSecond / 1000);
    await this.#client[COMMAND](this.redisKey(keyId), plan.capacity, perMs, 0, 0, tokens, instance, leaving ? 0 : -1);
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
