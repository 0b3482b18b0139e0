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
 * `register` > 0 (re)registers the instance for that many ms, 0 removes its entry (it stops),
 * -1 leaves it as it is.
 *
 * Deadline. `deadline` (Redis ms, 0: none) is when the caller stops waiting for the answer: a
 * script that runs later (Redis was frozen or slow, the command sat in its queue) changes nothing
 * and answers -1, so no token leaves the bucket for a caller that is no longer there.
 *
 * Lease records. A lease of `taken` tokens keeps `reserve` = min(taken - need, ceil(taken / 4))
 * of them (its last quarter) that the instance spends only once it has sent its next call for the
 * key. Field `l:<instance>:<reserve>` records that promise until `hold` ms from now; the
 * instance's next lease call replaces it, and giving its newest lease back (`clear` 1) removes
 * it. A record that lapses (its instance died, or Redis never heard from it again) is reclaimed
 * by whichever call finds it: its reserve goes back into the bucket, and a tombstone
 * `z:<instance>:<reserve>` lets that instance's give-back, should it come after all, take the
 * reclaimed part off what it returns. Field values are all lapse times, so older perch versions
 * that read the hash count them as instances for a while, then drop them. Under steady traffic
 * the record keeps its name (the same reserve), and every write goes in one HSET: a lease costs
 * Redis the same commands as before records existed.
 * Outcome records. A lease call (`seq` > 0) leaves field `o:<instance>` for 10 s, in the same
 * HSET: its lapse time, and after the decimal point its seq, taken, give and reserve (see
 * `read_outcome`), so that older versions read a lapse time there too. A call the instance gave up on (its answer came
 * after the command timeout: a deadline reckoned on an offset that was low by the answer's own
 * delay still lets such a script run) is listed in `abandoned` with the key's next lease call;
 * if the record shows one of them ran, what it took comes back and what it charged is undone
 * (the instance sends the debt again with this call), so nothing is taken that nobody holds.
 * Calls on one connection run in order, so a call given up on has run, or never will, by then.
 * `give` unspent tokens come back first, exactly, up to capacity; a negative `give` takes off
 * what the instance allowed from its memory bucket while Redis did not answer (down to empty).
 *
 * KEYS[1] bucket; ARGV capacity, tokens per millisecond, want, need, give, instance, register,
 * deadline, clear, hold, seq (0: no outcome record), abandoned (seqs, comma-separated). Returns
 * allowed (0/1, -1 past the deadline), the tokens left, the tokens taken, Redis's time (ms) and
 * the reserve recorded.
 */
const TAKE_SCRIPT = `
local capacity = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local give = tonumber(ARGV[5])
local give_sent = give
local instance = ARGV[6]
local me = 'i:' .. instance
local register = tonumber(ARGV[7])
local deadline = tonumber(ARGV[8])
local clear = ARGV[9] == '1'
local hold = tonumber(ARGV[10])
local seq = ARGV[11]
local abandoned = ',' .. ARGV[12] .. ','
local outcome = 'o:' .. instance
-- An outcome record's value: its lapse time, '.', the sign of its give, then seq, taken, |give|
-- and reserve, each as two digits of length and its digits. A number still, for older versions.
local function pack(n)
  local s = string.format('%d', n)
  return string.format('%02d', string.len(s)) .. s
end
local function read_outcome(value)
  local lapses, rest = string.match(value, '^(%d+)%.(%d+)$')
  if rest == nil then return tonumber(value) or 0, nil end
  local parts = {}
  local pos = 2
  for k = 1, 4 do
    local len = tonumber(string.sub(rest, pos, pos + 1)) or 0
    parts[k] = string.sub(rest, pos + 2, pos + 1 + len)
    pos = pos + 2 + len
  end
  if string.sub(rest, 1, 1) == '1' then parts[3] = '-' .. parts[3] end
  return tonumber(lapses), parts
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if deadline > 0 and now > deadline then
  return {-1, '0', 0, string.format('%d', now), 0}
end
local state = redis.call('HGETALL', KEYS[1])
local tokens = nil
local at = nil
local fleet = 0
local live_until = now
local reclaimed = 0
local own_record = nil
local mine = nil
local gone = {}
local writes = {}
local abandoned_taken = nil
local abandoned_give = 0
local abandoned_reserve = 0
for i = 1, #state, 2 do
  local field = state[i]
  local value = state[i + 1]
  if field == 'tokens' then
    tokens = tonumber(value)
  elseif field == 'at' then
    at = tonumber(value)
  elseif field == me then
    mine = tonumber(value)
  elseif string.sub(field, 1, 2) == 'o:' then
    local lapses, parts = read_outcome(value)
    if field == outcome and seq ~= '0' then
      if parts ~= nil and parts[1] ~= '' and string.find(abandoned, ',' .. parts[1] .. ',', 1, true) then
        abandoned_taken = tonumber(parts[2]) or 0
        abandoned_give = tonumber(parts[3]) or 0
        abandoned_reserve = tonumber(parts[4]) or 0
      end
    elseif lapses <= now then
      gone[#gone + 1] = field
    else
      live_until = math.max(live_until, lapses)
    end
  else
    local lapses = tonumber(value) or 0
    local kind = string.sub(field, 1, 2)
    if kind == 'l:' or kind == 'z:' then
      local holder, reserve = string.match(field, '^..([^:]*):([^:]*)$')
      reserve = tonumber(reserve) or 0
      if holder == instance and instance ~= '' then
        if kind == 'l:' then
          own_record = field
          if hold == 0 and not clear and register ~= 0 then live_until = math.max(live_until, lapses) end
        elseif clear and hold > 0 then
          give = give - reserve
          gone[#gone + 1] = field
        elseif clear then
          give = math.max(0, give - reserve)
          gone[#gone + 1] = field
        elseif lapses <= now then
          gone[#gone + 1] = field
        else
          live_until = math.max(live_until, lapses)
        end
      elseif lapses <= now then
        gone[#gone + 1] = field
        if kind == 'l:' and reserve > 0 then
          reclaimed = reclaimed + reserve
          writes[#writes + 1] = 'z:' .. holder .. ':' .. reserve
          writes[#writes + 1] = string.format('%d', now + 10000)
          live_until = math.max(live_until, now + 10000)
        end
      else
        live_until = math.max(live_until, lapses)
      end
    elseif lapses > now then
      fleet = fleet + 1
      live_until = math.max(live_until, lapses)
    else
      gone[#gone + 1] = field
    end
  end
end
if tokens == nil or at == nil then
  tokens = capacity
else
  tokens = math.min(capacity, tokens + math.max(0, now - at) * per_ms)
end
if abandoned_taken ~= nil then
  -- A call this instance gave up on ran after all: what it took comes back, and what it charged
  -- (the instance sends it again with this call) is undone. Its reserve is the record this call
  -- replaces, or was reclaimed already when that record lapsed.
  local refund = abandoned_taken - abandoned_give
  if abandoned_reserve > 0 and own_record ~= 'l:' .. instance .. ':' .. abandoned_reserve then
    refund = refund - abandoned_reserve
    gone[#gone + 1] = 'z:' .. instance .. ':' .. abandoned_reserve
  end
  give = give + refund
end
tokens = math.max(0, math.min(capacity, tokens + reclaimed + give))
if instance ~= '' then
  if register > 0 then
    writes[#writes + 1] = me
    writes[#writes + 1] = string.format('%d', now + register)
    live_until = math.max(live_until, now + register)
    fleet = fleet + 1
  elseif register == 0 then
    if mine ~= nil then gone[#gone + 1] = me end
  elseif mine ~= nil and mine > now then
    live_until = math.max(live_until, mine)
  end
end
local allowed = 0
local taken = 0
local reserve = 0
if tokens + 1e-9 >= need then
  allowed = 1
  local share = math.max(need, math.floor((tokens + 1e-9) / (2 * math.max(1, fleet))))
  taken = math.min(want, share, math.floor(tokens + 1e-9))
  tokens = math.max(0, tokens - taken)
end
local record = nil
if hold > 0 and instance ~= '' then
  reserve = math.min(math.max(0, taken - need), math.ceil(taken / 4))
  if reserve > 0 then
    record = 'l:' .. instance .. ':' .. reserve
    writes[#writes + 1] = record
    writes[#writes + 1] = string.format('%d', now + hold)
    live_until = math.max(live_until, now + hold)
  end
end
if seq ~= '0' then
  writes[#writes + 1] = outcome
  writes[#writes + 1] = string.format('%d', now + 10000) .. '.' .. (give_sent < 0 and '1' or '0') .. pack(tonumber(seq)) .. pack(taken) .. pack(math.abs(give_sent)) .. pack(reserve)
  live_until = math.max(live_until, now + 10000)
end
if own_record ~= nil and own_record ~= record and (hold > 0 or clear or register == 0) then gone[#gone + 1] = own_record end
if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
local ms_to_full = math.ceil((capacity - tokens) / per_ms)
local keep = math.max(ms_to_full, live_until - now)
if keep <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%d', now), unpack(writes))
  redis.call('PEXPIRE', KEYS[1], keep)
end
return {allowed, string.format('%.17g', tokens), taken, string.format('%d', now), reserve}
`;

const COMMAND = 'perchTakeToken';

/** Lease calls given up on that a key's next call can still undo, and keys that remember them. */
const MAX_ABANDONED = 16;
const MAX_ABANDONED_KEYS = 10_000;

type Reply = [allowed: number, tokens: string, taken: number, redisNow: string, reserve: number];

interface WithTakeCommand {
  [COMMAND](key: string, capacity: number, perMs: string, want: number, need: number, give: number, instance: string, register: number, deadline: number, clear: string, hold: number, seq: number, abandoned: string): Promise<Reply>;
}

/** The memory buckets that insure the shared ones (memory-limiter.ts). */
export interface Insurance {
  /** What Redis reported of a bucket: each answer's tokens, for the memory bucket to start from. */
  seed(keyId: string, plan: Plan, tokens: number): void;
  /** Tokens allowed in memory while Redis did not answer, less what the bucket refilled past: taken off the shared bucket by the next call. */
  claim(keyId: string, plan: Plan): number;
  /** A claim whose call failed: still owed. */
  unclaim(keyId: string, plan: Plan, tokens: number): void;
  /** The keys with a claim or a credit, to settle once Redis answers again. */
  debtors(): [string, Plan][];
}

/** A lease's answer: tokens taken, tokens left in the bucket, and the reserve Redis recorded. */
export interface LeaseAnswer {
  readonly taken: number;
  readonly tokens: number;
  readonly reserve: number;
}

/** Buckets shared by every instance through one Redis; keys are `${prefix}rl:${keyId}`. */
export class RedisLimiter implements BucketLimiter {
  readonly #client: WithTakeCommand;
  readonly #prefix: string;
  readonly #timeoutMs: number;
  readonly #firstReady: Promise<void>;
  readonly #insurance: Insurance | undefined;
  #everReady = false;
  #connectionFailed = false;
  /**
   * Redis's clock minus this process's monotonic clock, as the last answer showed it (a lower
   * bound: the answer was made before it arrived), so a deadline can be said in Redis time. The
   * monotonic clock, not the injected one: the deadline mirrors ioredis's command timeout, which
   * runs on real time.
   */
  #offset: number | undefined;
  /** When `#offset` was last set from one answer alone (monotonic ms), see `#learnOffset`. */
  #offsetSince = 0;
  /** Sequence number of this instance's last lease call, for its outcome record. */
  #seq = 0;
  /** Per key, the lease calls given up on since its last answered one (see `#abandon`). */
  readonly #abandoned = new Map<string, number[]>();
  /** Keys whose next lease call carries a credit that includes a recorded reserve (`credit`). */
  readonly #clearNext = new Set<string>();
  /** Whether debts are being settled (`#settle`). */
  #settling = false;

  constructor(client: RedisClient, options: { prefix: string; commandTimeoutMs: number; insurance?: Insurance }) {
    // defineCommand sends EVALSHA and falls back to EVAL when Redis does not know the script
    // (e.g. after a restart), so the script text crosses the wire only when needed.
    client.defineCommand(COMMAND, { numberOfKeys: 1, lua: TAKE_SCRIPT });
    this.#client = client as unknown as WithTakeCommand;
    this.#prefix = `${options.prefix}rl:`;
    this.#timeoutMs = options.commandTimeoutMs;
    this.#insurance = options.insurance;
    this.#firstReady = new Promise((resolve) => client.once('ready', resolve)).then(() => void (this.#everReady = true));
    client.on('error', () => (this.#connectionFailed = true));
  }

  async take(keyId: string, plan: Plan, cost: 0 | 1): Promise<Verdict> {
    const [allowed, tokens] = await this.#run(keyId, plan, cost, cost, 0, '', -1, true, '', 0);
    return { plan, allowed: allowed === 1, tokens: Number(tokens) };
  }

  /**
   * Takes up to `want` whole tokens for `instance` (fewer when other instances lease too: see the
   * script) and the tokens left after, registering the instance as one that leases for
   * `registerMs`, and recording the lease's reserve for `holdMs`. `need` 1: a
   * request waits for it, so it gets a token while one is there; 0: a lease taken ahead, which
   * gets nothing once the instance's share rounds to no token. Rejects when Redis fails, or would
   * have answered after this instance stopped waiting (then it took nothing).
   */
  async lease(keyId: string, plan: Plan, want: number, need: 0 | 1, instance: string, registerMs: number, holdMs: number): Promise<LeaseAnswer> {
    const [, tokens, taken, , reserve] = await this.#run(keyId, plan, want, need, 0, instance, registerMs, true, '', holdMs);
    return { taken, tokens: Number(tokens), reserve };
  }

  /**
   * Puts `tokens` unspent leased tokens back, exactly, up to capacity; `newest`: they include the
   * instance's newest lease, whose record goes (less what Redis already reclaimed of it, see the
   * script); `leaving`: the instance stops, so it no longer counts among those that lease. No
   * deadline: tokens that come back late still come back.
   */
  async giveBack(keyId: string, plan: Plan, tokens: number, instance: string, newest: boolean, leaving: boolean): Promise<void> {
    await this.#run(keyId, plan, 0, 0, tokens, instance, leaving ? 0 : -1, false, newest ? '1' : '', 0);
  }

  /**
   * Unspent leased tokens that could not be given back (the breaker was open): they go with the
   * key's next call that Redis answers, like a debt the other way. `recorded`: they include the
   * newest lease's reserve, so that call clears the instance's record as a give-back would.
   */
  credit(keyId: string, plan: Plan, tokens: number, recorded: boolean): void {
    if (this.#insurance === undefined) return;
    this.#insurance.unclaim(keyId, plan, -tokens);
    if (recorded) this.#clearNext.add(keyId);
  }

  /** The Redis key of a key's bucket: what decides which cluster node holds it. */
  redisKey(keyId: string): string {
    return this.#prefix + keyId;
  }

  /**
   * One script call. With `deadline`, the script refuses to run once this instance has stopped
   * waiting; an answer of -1 that still arrives in time means the deadline was reckoned on a
   * clock offset that was off (another cluster node, a clock step): it is run once more on the
   * offset that answer showed.
   */
  async #run(keyId: string, plan: Plan, want: number, need: number, give: number, instance: string, register: number, deadline: boolean, clear: string, hold: number): Promise<Reply> {
    if (!this.#everReady && !this.#connectionFailed) await this.#awaitFirstConnection();
    const perMs = String(plan.refillPerSecond / 1000);
    // What memory allowed while Redis failed goes with a call Redis runs at most once: one with a deadline.
    const owed = deadline ? (this.#insurance?.claim(keyId, plan) ?? 0) : 0;
    const recorded = deadline && instance !== '';
    const clearing = recorded && this.#clearNext.has(keyId);
    if (clearing) clear = '1';
    try {
      for (let attempt = 0; ; attempt++) {
        const sent = performance.now();
        const at = deadline && this.#offset !== undefined ? Math.floor(sent + this.#offset + this.#timeoutMs) : 0;
        const seq = recorded ? ++this.#seq : 0;
        const abandoned = recorded ? this.#abandoned.get(keyId) : undefined;
        let reply: Reply;
        try {
          reply = await this.#client[COMMAND](this.redisKey(keyId), plan.capacity, perMs, want, need, give - owed, instance, register, at, clear, hold, seq, abandoned?.join(',') ?? '');
        } catch (error) {
          if (recorded) this.#abandon(keyId, abandoned, seq);
          throw error;
        }
        this.#learnOffset(Number(reply[3]) - performance.now(), reply[0] === -1);
        if (reply[0] === -1) {
          // Refused: it ran nothing, not even the reconciliation, so the calls given up on stay listed.
          if (attempt === 0) continue;
          throw new Error('rate limits: Redis answered past the deadline');
        }
        if (abandoned !== undefined) this.#abandoned.delete(keyId);
        if (clearing) this.#clearNext.delete(keyId);
        this.#insurance?.seed(keyId, plan, Number(reply[1]));
        if (!this.#settling) void this.#settle();
        return reply;
      }
    } catch (error) {
      if (owed !== 0) this.#insurance!.unclaim(keyId, plan, owed);
      throw error;
    }
  }

  /**
   * Redis answered: what the memory buckets allowed (or leases could not give back) while it did
   * not is settled now, key by key, one call at a time (a take of nothing that carries the
   * claim), stopping at the first failure. A key's own next request would settle it too, but
   * a client may not come back to this instance.
   */
  async #settle(): Promise<void> {
    this.#settling = true;
    try {
      for (const [keyId, plan] of this.#insurance?.debtors() ?? []) {
        // A credit that includes a lease's reserve on record waits for the key's next lease call,
        // which clears that record with it (see `credit`).
        if (!this.#clearNext.has(keyId)) await this.#run(keyId, plan, 0, 0, 0, '', -1, true, '', 0);
      }
    } catch {
      // Still owed: the next answer settles it.
    } finally {
      this.#settling = false;
    }
  }

  /**
   * A call given up on (it failed or timed out here) may still have run in Redis: a deadline
   * reckoned on an offset that was low by the answer's own delay lets a script run whose answer
   * then arrives after the command timeout. Its sequence number goes with the key's next call,
   * which undoes it in Redis should the key's outcome record show it ran (see the script).
   */
  #abandon(keyId: string, earlier: number[] | undefined, seq: number): void {
    const list = earlier === undefined ? [seq] : [...earlier.slice(-(MAX_ABANDONED - 1)), seq];
    this.#abandoned.delete(keyId);
    this.#abandoned.set(keyId, list);
    if (this.#abandoned.size > MAX_ABANDONED_KEYS) this.#abandoned.delete(this.#abandoned.keys().next().value!);
  }

  /**
   * Each answer gives a lower bound of the offset (it was made before it arrived, and a busy
   * event loop sees it later still), so the best estimate is the largest; it is started afresh
   * every 10 s, and at once when Redis refused a deadline this instance was still within, so a
   * clock that stepped back is followed.
   */
  #learnOffset(sample: number, refused: boolean): void {
    const now = performance.now();
    if (this.#offset === undefined || refused || now - this.#offsetSince > 10_000) {
      this.#offset = sample;
      this.#offsetSince = now;
    } else this.#offset = Math.max(this.#offset, sample);
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
