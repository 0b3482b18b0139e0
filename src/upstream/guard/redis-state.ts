import type { RedisClient } from '../../redis/redis-client.js';
import { IN_FLIGHT_POLL_MS } from './memory-state.js';
import {
  CLOCK_GRANULARITY_MS,
  stopKeysFor,
  type Admission,
  type AdmitQuery,
  type CallCap,
  type HeldCall,
  type OutcomeReport,
  type OutcomeTotals,
  type ProviderState,
  type Spend,
  type SpendQuery,
  type Stop,
  type StopState,
} from './provider-state.js';

/**
 * One admission as one atomic script, so instances never both take the last place: the stops
 * of each candidate credential are read (the first one free is chosen), then the cap is checked
 * and, only if every part of it has room, taken. Stops compare against the caller's clock
 * (their times come from the provider's own headers); the cap uses Redis `TIME`, as the client
 * rate limits do, so instances with skewed clocks still share one window.
 *
 *
 * The cap is shared fairly among payers across the fleet, with the same start-time fair queuing
 * as each instance's queue (admission-queue.ts): a payer whose call cannot be admitted is
 * registered as waiting with its start tag (`max(virtual time, its last finish)`), and a place
 * under the cap goes only to the waiting payer with the lowest tag. So a crawler waiting on
 * instance A yields to an app waiting on instance B, whichever instance asks first. The token
 * the lower tag is owed stays in the bucket until its instance asks; an instance whose ask finds
 * the cap owed to another payer waiting there is told which (`owed`) and asks for it next.
 *
 * A registration lives `FAIR_LIVENESS_MS` from the latest ask that named its payer: each ask
 * renews the turns of the payers waiting on the asking instance (`waiting`), and an instance
 * asks at least every `FAIR_RENEW_MS` while any call waits there. A payer whose last waiting call
 * leaves without a place is withdrawn at once (`withdraw`); one whose instance went away or whose
 * withdrawal was lost lapses within the liveness. So no payer is owed the cap for longer than
 * that after its last waiting call left, on any instance.
 *
 * KEYS: bucket, rate log, quota log, leases, fair tags (hash), waiting payers (zset by tag),
 * their liveness (zset by expiry), then per candidate its stop keys (see ARGV).
 * ARGV: now, per-second rate (0: none), burst, window limit, window ms, quota (0: none),
 * quota window ms, max concurrent (0: none), lease id, lease ms, number of candidates,
 * stop keys per candidate, payer id, payer weight, whether the call waits if refused (1/0),
 * then the candidate ids, then the ids of the payers waiting on the caller's instance.
 */
/** How long a payer's registration in the fleet's fair queue lives without an ask renewing it. */
export const FAIR_LIVENESS_MS = 1000;
/** How often an instance with waiting calls asks at least, so their registrations never lapse. */
export const FAIR_RENEW_MS = FAIR_LIVENESS_MS / 2;

/**
 * The fair queue's bookkeeping, shared by the admission and the withdrawal scripts (locals
 * `fair`, `waiting`, `live` and the virtual time `vt` in scope). A payer's finish tag (`f:<id>`)
 * matters only while it is ahead of the virtual time and someone waits: a payer that leaves
 * with its finish behind the virtual time loses its field at once; when the last registration
 * leaves (withdrawn or lapsed) nobody is owed anything and the hash goes; and it never holds more
 * than `2 * (payers waiting) + 65` fields (the virtual time, and at most 64 more than twice the
 * waiting payers of payers gone), so key churn cannot grow it.
 */
const FAIR_FUNCTIONS = `
local function leave(id)
  redis.call('ZREM', waiting, id)
  redis.call('ZREM', live, id)
  local f = tonumber(redis.call('HGET', fair, 'f:' .. id) or '-1')
  if f >= 0 and f <= vt then redis.call('HDEL', fair, 'f:' .. id) end
end
local function tidy(left)
  local n = redis.call('ZCARD', waiting)
  if n == 0 and left then
    redis.call('DEL', fair)
    return
  end
  if redis.call('HLEN', fair) > 2 * n + 65 then
    for _, field in ipairs(redis.call('HKEYS', fair)) do
      if string.sub(field, 1, 2) == 'f:' and not redis.call('ZSCORE', waiting, string.sub(field, 3)) then redis.call('HDEL', fair, field) end
    end
  end
end
`;

const ADMIT_SCRIPT = `
local now = tonumber(ARGV[1])
local ncand = tonumber(ARGV[11])
local per = tonumber(ARGV[12])
local chosen = nil
local best_until = nil
local best_state = nil
for i = 1, ncand do
  local u, st = 0, nil
  for j = 1, per do
    local v = redis.call('GET', KEYS[7 + (i - 1) * per + j])
    if v then
      local sp = string.find(v, ' ', 1, true)
      local t = tonumber(string.sub(v, 1, sp - 1))
      if t > now and t > u then u, st = t, string.sub(v, sp + 1) end
    end
  end
  if u == 0 then chosen = ARGV[15 + i]; break end
  if best_until == nil or u < best_until then best_until, best_state = u, st end
end
if chosen == nil then return {'stopped', string.format('%d', best_until), best_state} end

local time = redis.call('TIME')
local rnow = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Milliseconds until the sliding log at key holds fewer than limit calls; a mark in the future
-- is a call in flight, which frees its place only a window after its answer: look again soon.
local function window_wait(key, limit, window)
  window = window + ${CLOCK_GRANULARITY_MS}
  redis.call('ZREMRANGEBYSCORE', key, '-inf', rnow - window)
  local n = redis.call('ZCARD', key)
  if n < limit then return 0 end
  local edge = tonumber(redis.call('ZRANGE', key, n - limit, n - limit, 'WITHSCORES')[2])
  if edge > rnow then return 25 end
  return edge + window - rnow
end
local wait = 0
local rate = tonumber(ARGV[2])
local tokens = 0
local at = rnow
if rate > 0 then
  local burst = tonumber(ARGV[3])
  local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
  tokens = tonumber(state[1])
  local stored_at = tonumber(state[2])
  if tokens == nil or stored_at == nil then
    tokens = burst
  else
    tokens = math.min(burst, tokens + math.max(0, rnow - stored_at) * rate / 1000)
    at = math.max(stored_at, rnow)
  end
  local token_wait = 0
  if tokens + 1e-9 < 1 then token_wait = math.ceil((1 - tokens) * 1000 / rate) end
  local held = window_wait(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
  if held > 0 and held >= token_wait then
    -- Waiting for the window saves no burst (memory-state.ts, holdBurst): one token, from its end.
    tokens, at = 1, rnow + held
    redis.call('HSET', KEYS[1], 'tokens', '1', 'at', string.format('%d', at))
    redis.call('PEXPIRE', KEYS[1], held + math.ceil(burst * 1000 / rate) + 1000)
  end
  wait = math.max(wait, token_wait, held)
end
local quota = tonumber(ARGV[6])
if quota > 0 then wait = math.max(wait, window_wait(KEYS[3], quota, tonumber(ARGV[7]))) end
local maxc = tonumber(ARGV[8])
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', rnow)
  if redis.call('ZCARD', KEYS[4]) >= maxc then wait = math.max(wait, 25) end
end

local payer = ARGV[13]
local fair, waiting, live = KEYS[5], KEYS[6], KEYS[7]
local vt = tonumber(redis.call('HGET', fair, 'v') or '0')
${FAIR_FUNCTIONS}
local stays = {}
for i = 16 + ncand, #ARGV do stays[ARGV[i]] = true end
local lapsed = false
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', live, '-inf', rnow)) do
  if gone ~= payer and not stays[gone] then
    leave(gone)
    lapsed = true
  end
end
local function tag_of(id)
  local t = redis.call('ZSCORE', waiting, id)
  if t then return tonumber(t) end
  return math.max(vt, tonumber(redis.call('HGET', fair, 'f:' .. id) or '0'))
end
local expiry = rnow + ${FAIR_LIVENESS_MS}
local function register(id, tag)
  redis.call('ZADD', waiting, tag, id)
  redis.call('ZADD', live, expiry, id)
  redis.call('PEXPIRE', waiting, ${FAIR_LIVENESS_MS + 1000})
  redis.call('PEXPIRE', live, ${FAIR_LIVENESS_MS + 1000})
end
for id in pairs(stays) do
  if id ~= payer then register(id, tag_of(id)) end
end
local tag = tag_of(payer)
local first = redis.call('ZRANGE', waiting, 0, 0, 'WITHSCORES')
local owed = first[1] ~= nil and first[1] ~= payer and tonumber(first[2]) < tag
if wait > 0 or owed then
  if ARGV[15] == '1' or stays[payer] then register(payer, tag) end
  tidy(lapsed)
  if wait == 0 and stays[first[1]] then return {'owed', first[1]} end
  -- Another payer's turn: look again soon, in case its instance does not come for the place.
  if wait == 0 then wait = 25 end
  return {'wait', string.format('%d', math.max(1, wait))}
end
local finish = tag + 1 / tonumber(ARGV[14])
redis.call('HSET', fair, 'v', string.format('%.17g', math.max(vt, tag)), 'f:' .. payer, string.format('%.17g', finish))
redis.call('PEXPIRE', fair, 3600000)
if stays[payer] then
  register(payer, finish)
else
  redis.call('ZREM', waiting, payer)
  redis.call('ZREM', live, payer)
end
tidy(lapsed)

local lease = ARGV[9]
local lease_ms = tonumber(ARGV[10])
-- Until its answer a call counts as if it reached the provider at the end of its lease.
local in_flight = rnow + lease_ms
if rate > 0 then
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', math.max(0, tokens - 1)), 'at', string.format('%d', at))
  redis.call('PEXPIRE', KEYS[1], (at - rnow) + math.ceil(tonumber(ARGV[3]) * 1000 / rate) + 1000)
  redis.call('ZADD', KEYS[2], in_flight, lease)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[5]) + lease_ms + 1000)
end
if quota > 0 then
  redis.call('ZADD', KEYS[3], in_flight, lease)
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]) + lease_ms + 1000)
end
if maxc > 0 then
  redis.call('ZADD', KEYS[4], in_flight, lease)
  redis.call('PEXPIRE', KEYS[4], lease_ms + 1000)
end
return {'ok', chosen}
`;

/**
 * Keeps the longer of the stored and the new stop: a 429's short wait must not cut short a
 * usage cap already recorded. The key expires with its stop (plus a margin) so nothing lingers.
 * KEYS[1] stop; ARGV until, state, ttl ms.
 */
const STOP_SCRIPT = `
local v = redis.call('GET', KEYS[1])
if v then
  local old = tonumber(string.sub(v, 1, string.find(v, ' ', 1, true) - 1))
  if old >= tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], 'PX', ARGV[3])
return 1
`;

/**
 * A call has its answer: its marks in the windows move to now (they age from here), its lease
 * ends. XX: a mark already aged out of its log is not brought back. In the quota log the call
 * takes the name the instance's memory now counts it by (ARGV[2], when it has one), so that a
 * write-back of memory's count to a Redis that kept the call counts it once, not twice.
 * KEYS rate log, quota log, leases; ARGV lease id, quota name ('' to keep the lease id).
 */
const FINISH_SCRIPT = `
local time = redis.call('TIME')
local rnow = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZADD', KEYS[1], 'XX', rnow, ARGV[1])
if ARGV[2] == '' then
  redis.call('ZADD', KEYS[2], 'XX', rnow, ARGV[1])
elseif redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[2], rnow, ARGV[2])
end
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
`;

/**
 * What one instance counted while Redis was away, written back before Redis admits for it again:
 * each call's marks in the rate and quota logs and its lease while in flight, or the end of its
 * lease once answered (a call Redis admitted whose finish could not reach it). Marks come as
 * offsets from the instance's now and land on Redis `TIME`, as the admission's own do. A key's
 * expiry is only ever lengthened, to cover its latest mark.
 * KEYS rate log, quota log, leases; ARGV rate window ms, quota window ms, then per call its id
 * and its rate, quota and lease offsets ('' where it has none).
 */
const WRITE_BACK_SCRIPT = `
local time = redis.call('TIME')
local rnow = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local latest = {-1, -1, -1}
for i = 3, #ARGV, 4 do
  for k = 1, 3 do
    local offset = ARGV[i + k]
    if offset ~= '' then
      local mark = rnow + tonumber(offset)
      redis.call('ZADD', KEYS[k], mark, ARGV[i])
      if mark > latest[k] then latest[k] = mark end
    elseif k == 3 then
      redis.call('ZREM', KEYS[3], ARGV[i])
    end
  end
end
local windows = {tonumber(ARGV[1]) + ${CLOCK_GRANULARITY_MS}, tonumber(ARGV[2]) + ${CLOCK_GRANULARITY_MS}, 0}
for k = 1, 3 do
  if latest[k] >= 0 then
    local ttl = latest[k] - rnow + windows[k] + 1000
    if redis.call('PTTL', KEYS[k]) < ttl then redis.call('PEXPIRE', KEYS[k], ttl) end
  end
end
return 1
`;

/** Calls per write-back script: a long quota window's calls go in several, none of them huge. */
const WRITE_BACK_BATCH = 1000;

/**
 * A payer's last call waiting on the caller's instance left without a place: its registration
 * goes (see FAIR_FUNCTIONS). KEYS fair tags, waiting payers, their liveness; ARGV payer id.
 */
const WITHDRAW_SCRIPT = `
local fair, waiting, live = KEYS[1], KEYS[2], KEYS[3]
local vt = tonumber(redis.call('HGET', fair, 'v') or '0')
${FAIR_FUNCTIONS}
leave(ARGV[1])
tidy(true)
return 1
`;

/** Deletes a stop only if it is of the given state. KEYS[1] stop; ARGV state. */
const LIFT_SCRIPT = `
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, string.find(v, ' ', 1, true) + 1) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`;

/**
 * One instance's report to an adaptive throttle's window (throttle.ts), and the fleet's totals
 * back, in one step. The window is a hash of `<slice>:a` / `<slice>:f` counts (accepted, failed)
 * on the callers' clocks; slices that left the window are deleted as they are met. `epoch` is the
 * slice of the latest reset: a reset deletes every count, and a report made before the caller
 * knew of a newer reset is dropped, so the failures of an outage cannot come back through it.
 * KEYS[1] window; ARGV slice, slices, ttl ms, epoch, reset (1/0), then [slice, accepts, failures]...
 */
const OUTCOMES_SCRIPT = `
local slice = tonumber(ARGV[1])
local oldest = slice - tonumber(ARGV[2])
local epoch = tonumber(ARGV[4])
local stored = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '-1')
if epoch > stored then
  -- A reset, or a window that expired while idle and so forgot its epoch.
  if ARGV[5] == '1' then redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], 'epoch', string.format('%d', epoch))
  stored = epoch
end
if epoch == stored then
  for i = 6, #ARGV, 3 do
    if tonumber(ARGV[i]) > oldest then
      redis.call('HINCRBY', KEYS[1], ARGV[i] .. ':a', ARGV[i + 1])
      redis.call('HINCRBY', KEYS[1], ARGV[i] .. ':f', ARGV[i + 2])
    end
  end
end
local all = redis.call('HGETALL', KEYS[1])
local accepts, failures = 0, 0
for i = 1, #all, 2 do
  local sep = string.find(all[i], ':', 1, true)
  if sep then
    local s = tonumber(string.sub(all[i], 1, sep - 1))
    if s <= oldest then
      redis.call('HDEL', KEYS[1], all[i])
    elseif s <= slice then
      if string.sub(all[i], sep + 1) == 'a' then accepts = accepts + tonumber(all[i + 1]) else failures = failures + tonumber(all[i + 1]) end
    end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {accepts, failures, stored}
`;

/**
 * A key's budget for a calendar window is two counts: the calls charged, which only grows, and
 * those given back; what the window spent is the difference. A caller's count (what it knows the
 * window spent) raises the charged count, never what was given back: a Redis that restarted
 * empty has lost both, and one that did not holds at least that many charged, so an instance
 * that saw a count before another instance's refund does not take the refund back.
 * The keys expire a day after the window ends, so a restart within the window finds the counts,
 * and nothing lingers. The expiry is relative, from the caller's clock, as the windows are.
 */

/**
 * One call against a key's budget, only if it has room, the charged count first raised to what
 * the caller knows. KEYS[1] charged, KEYS[2] given back; ARGV limit, time to live (ms), the
 * caller's count. Returns whether it was charged and what the window spent.
 */
const SPEND_SCRIPT = `
local charged = tonumber(redis.call('GET', KEYS[1]) or '0')
local refunded = tonumber(redis.call('GET', KEYS[2]) or '0')
local known = tonumber(ARGV[3])
if known > charged then
  charged = known
  redis.call('SET', KEYS[1], charged, 'PX', ARGV[2])
end
if charged - refunded >= tonumber(ARGV[1]) then return {0, charged - refunded} end
charged = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, charged - refunded}
`;

/** Gives one call back, never below none spent. KEYS[1] charged, KEYS[2] given back. */
const REFUND_SCRIPT = `
local charged = tonumber(redis.call('GET', KEYS[1]) or '0')
local refunded = tonumber(redis.call('GET', KEYS[2]) or '0')
if charged - refunded <= 0 then return 0 end
redis.call('INCR', KEYS[2])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return charged - refunded - 1
`;

/**
 * Adds calls one instance charged to a budget while Redis was away, and raises the charged count
 * to what that instance knows the window spent (Redis's last word to it and its calls since): a
 * Redis that restarted empty has lost the rest. Counted whatever the limit: they were made.
 * KEYS[1] charged, KEYS[2] given back; ARGV calls, ttl ms, the caller's count. Returns what the
 * window spent.
 */
const ADD_SPENDS_SCRIPT = `
local charged = redis.call('INCRBY', KEYS[1], ARGV[1])
if charged < tonumber(ARGV[3]) then
  charged = tonumber(ARGV[3])
  redis.call('SET', KEYS[1], charged)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return charged - tonumber(redis.call('GET', KEYS[2]) or '0')
`;

/**
 * The generation of an upstream's keyspace: set by the first instance to ask after Redis came
 * back empty (or first started), with the server's run id and Redis's time then. KEYS[1] the
 * generation; ARGV a new one, taken if there is none or if it was set by another run of the
 * server: one that restarted from its snapshot or append-only file, or a replica promoted, has
 * the generation but not the calls of its last moments, as an empty one lacks them all. Returns
 * it, 1 if it was just taken, and its age in ms (a generation written without a time is as old
 * as can be).
 */
const GENERATION_SCRIPT = `
local time = redis.call('TIME')
local rnow = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- A server that refuses INFO to scripts (a renamed command, a managed service) gives no run id:
-- only a missing generation then tells a restart.
local ok, info = pcall(redis.call, 'INFO', 'server')
local run = ok and type(info) == 'string' and string.match(info, 'run_id:(%x+)') or ''
local g = redis.call('GET', KEYS[1])
if g and string.find(g, ' ' .. run .. ' ', 1, true) then
  local at = tonumber(string.match(g, ' (%d+)$') or '0')
  return {g, 0, rnow - at}
end
local v = ARGV[1] .. ' ' .. run .. ' ' .. rnow
redis.call('SET', KEYS[1], v)
return {v, 1, 0}
`;

const ADMIT = 'perchAdmitCall';
const SPEND = 'perchSpendBudget';
const REFUND = 'perchRefundBudget';
const ADD_SPENDS = 'perchAddSpends';
const GENERATION = 'perchGeneration';
const OUTCOMES = 'perchThrottleOutcomes';
const LIFT = 'perchLiftStop';
const FINISH = 'perchFinishCall';
const STOP = 'perchStopCalls';
const WRITE_BACK = 'perchWriteBackCalls';
const WITHDRAW = 'perchWithdrawPayer';

interface WithScripts {
  [ADMIT](...args: (string | number)[]): Promise<[string, string, string?]>;
  [STOP](key: string, until: string, state: string, ttl: number): Promise<number>;
  [FINISH](recent: string, quota: string, leases: string, lease: string, quotaName: string): Promise<number>;
  [LIFT](key: string, state: string): Promise<number>;
  [WITHDRAW](fair: string, waiting: string, live: string, payer: string): Promise<number>;
  [OUTCOMES](key: string, ...args: (string | number)[]): Promise<[number, number, number]>;
  [SPEND](charged: string, refunded: string, limit: number, ttlMs: number, known: number): Promise<[number, number]>;
  [REFUND](charged: string, refunded: string): Promise<number>;
  [ADD_SPENDS](charged: string, refunded: string, calls: number, ttlMs: number, known: number): Promise<number>;
  [GENERATION](key: string, candidate: string): Promise<[string, number, number]>;
  [WRITE_BACK](recent: string, quota: string, leases: string, ...args: (string | number)[]): Promise<number>;
}

/**
 * Stops and caps in Redis, shared by every instance: keys `<prefix>{up:<name>}:...`. The braces
 * are a Cluster hash tag, so one upstream's keys live on one node and its script may touch them
 * all; different upstreams spread over the cluster.
 */
export class RedisProviderState implements ProviderState {
  readonly #scripts: WithScripts;
  readonly #client: RedisClient;
  readonly #prefix: string;
  readonly #clockNow: () => number;
  readonly #firstReady: Promise<void>;
  readonly #timeoutMs: number;
  #everReady = false;
  #connectionFailed = false;

  constructor(client: RedisClient, options: { prefix: string; now: () => number; commandTimeoutMs: number }) {
    client.defineCommand(ADMIT, { lua: ADMIT_SCRIPT });
    client.defineCommand(STOP, { numberOfKeys: 1, lua: STOP_SCRIPT });
    client.defineCommand(FINISH, { numberOfKeys: 3, lua: FINISH_SCRIPT });
    client.defineCommand(LIFT, { numberOfKeys: 1, lua: LIFT_SCRIPT });
    client.defineCommand(WITHDRAW, { numberOfKeys: 3, lua: WITHDRAW_SCRIPT });
    client.defineCommand(OUTCOMES, { numberOfKeys: 1, lua: OUTCOMES_SCRIPT });
    client.defineCommand(SPEND, { numberOfKeys: 2, lua: SPEND_SCRIPT });
    client.defineCommand(REFUND, { numberOfKeys: 2, lua: REFUND_SCRIPT });
    client.defineCommand(ADD_SPENDS, { numberOfKeys: 2, lua: ADD_SPENDS_SCRIPT });
    client.defineCommand(GENERATION, { numberOfKeys: 1, lua: GENERATION_SCRIPT });
    client.defineCommand(WRITE_BACK, { numberOfKeys: 3, lua: WRITE_BACK_SCRIPT });
    this.#scripts = client as unknown as WithScripts;
    this.#client = client;
    this.#prefix = options.prefix;
    this.#clockNow = options.now;
    this.#timeoutMs = options.commandTimeoutMs;
    this.#firstReady = new Promise((resolve) => client.once('ready', resolve)).then(() => void (this.#everReady = true));
    client.on('error', () => (this.#connectionFailed = true));
  }

  async admit(query: AdmitQuery): Promise<Admission> {
    // As for the client buckets: right after start-up, wait for the first connection (up to a
    // command timeout) rather than report an outage that is not one.
    if (!this.#everReady && !this.#connectionFailed) await this.#awaitFirstConnection();
    const base = this.upstreamKey(query.upstream);
    // Every candidate of one call has stop keys of one form (configured ids, or a client's own key).
    const per = stopKeysFor(query.candidates[0] ?? 'x', query.scope).length;
    const stopKeys = query.candidates.flatMap((c) => stopKeysFor(c, query.scope).map(([cr, sc]) => `${base}:stop:${cr}:${sc}`));
    const keys = [`${base}:bucket`, `${base}:recent`, `${base}:quota`, `${base}:leases`, `${base}:fair`, `${base}:fairq`, `${base}:fairlive`, ...stopKeys];
    const { rate, quota, maxConcurrent } = query.cap;
    const args = [
      this.#clockNow(),
      rate?.perSecond ?? 0,
      rate?.burst ?? 0,
      rate?.windowLimit ?? 0,
      rate?.windowMs ?? 0,
      quota?.requests ?? 0,
      quota?.windowMs ?? 0,
      maxConcurrent ?? 0,
      query.leaseId,
      query.leaseMs,
      query.candidates.length,
      per,
      query.payer.id,
      query.payer.weight,
      query.waits === false ? 0 : 1,
      ...query.candidates,
      ...(query.waiting ?? []),
    ];
    // The script takes a variable number of keys, so their count leads the arguments.
    const [kind, a, b] = await this.#scripts[ADMIT](keys.length, ...keys, ...args);
    if (kind === 'ok') return { kind: 'admitted', credential: a };
    if (kind === 'stopped') return { kind: 'stopped', untilMs: Number(a), state: b as StopState };
    if (kind === 'owed') return { kind: 'over_cap', waitMs: IN_FLIGHT_POLL_MS, renewMs: FAIR_RENEW_MS, owed: a };
    return { kind: 'over_cap', waitMs: Number(a), renewMs: FAIR_RENEW_MS };
  }

  withdraw(upstream: string, payer: string): void {
    const base = this.upstreamKey(upstream);
    // Not awaited, as finish: a lost withdrawal holds the payer's turn until it lapses.
    this.#scripts[WITHDRAW](`${base}:fair`, `${base}:fairq`, `${base}:fairlive`, payer).catch(() => undefined);
  }

  finish(upstream: string, leaseId: string, lost?: () => void, quotaName = ''): void {
    const base = this.upstreamKey(upstream);
    // Not awaited: the answer is already on its way to the client. A lost finish only keeps the
    // call counted until its lease ends, which errs on the provider's side; `lost` hears of it.
    this.#scripts[FINISH](`${base}:recent`, `${base}:quota`, `${base}:leases`, leaseId, quotaName).catch(() => lost?.());
  }

  /** Writes one instance's calls of `upstream` into the shared logs and leases (WRITE_BACK_SCRIPT). */
  async writeBack(upstream: string, cap: CallCap, calls: readonly HeldCall[]): Promise<void> {
    const base = this.upstreamKey(upstream);
    const now = this.#clockNow();
    const offset = (mark: number | undefined) => (mark === undefined ? '' : Math.round(mark - now));
    for (let i = 0; i < calls.length; i += WRITE_BACK_BATCH) {
      const args = calls.slice(i, i + WRITE_BACK_BATCH).flatMap((call) => [call.id, offset(call.recent), offset(call.quota), offset(call.lease)]);
      await this.#scripts[WRITE_BACK](`${base}:recent`, `${base}:quota`, `${base}:leases`, cap.rate?.windowMs ?? 0, cap.quota?.windowMs ?? 0, ...args);
    }
  }

  async stop(stop: Stop): Promise<void> {
    const ttl = Math.max(1, stop.untilMs - this.#clockNow()) + 1000;
    const key = `${this.upstreamKey(stop.upstream)}:stop:${stop.credential}:${stop.scope}`;
    await this.#scripts[STOP](key, String(stop.untilMs), stop.state, ttl);
  }

  async lift(upstream: string, credential: string, scope: string, state: StopState): Promise<void> {
    await this.#scripts[LIFT](`${this.upstreamKey(upstream)}:stop:${credential}:${scope}`, state);
  }

  async exchange(report: OutcomeReport): Promise<OutcomeTotals> {
    const { slice, slices, sliceMs, epoch, reset, deltas } = report;
    // Two windows: an idle upstream's counts are gone by the time they could mislead.
    const ttlMs = Math.ceil(2 * slices * sliceMs);
    const [accepts, failures, stored] = await this.#scripts[OUTCOMES](
      `${this.upstreamKey(report.upstream)}:throttle`,
      slice,
      slices,
      ttlMs,
      epoch,
      reset ? 1 : 0,
      ...deltas.flat(),
    );
    return { accepts: Number(accepts), failures: Number(failures), epoch: Number(stored) };
  }

  /** Charges one call if the key's window has room, its count first raised to `known` (what the caller knows it spent). */
  async spend(query: SpendQuery, known = 0): Promise<Spend> {
    const ttlMs = Math.max(1, query.endMs - this.#clockNow()) + 86_400_000;
    const [allowed, used] = await this.#scripts[SPEND](this.budgetKey(query), this.#refundsKey(query), query.limit, ttlMs, known);
    return { allowed: Number(allowed) === 1, used: Number(used) };
  }

  /**
   * The generation of `upstream`'s keys in Redis, `candidate` if there was none (Redis is new or
   * restarted empty), whether it was just set, and how long ago it was set, in ms.
   */
  async generation(upstream: string, candidate: string): Promise<{ generation: string; fresh: boolean; ageMs: number }> {
    const [generation, fresh, ageMs] = await this.#scripts[GENERATION](`${this.upstreamKey(upstream)}:generation`, candidate);
    return { generation: String(generation), fresh: Number(fresh) === 1, ageMs: Number(ageMs) };
  }

  /**
   * Writes back `calls` charged to the key's window without Redis, the count raised to at least
   * `known`; answers the window's count.
   */
  async addSpends(query: SpendQuery, calls: number, known = 0): Promise<number> {
    const ttlMs = Math.max(1, query.endMs - this.#clockNow()) + 86_400_000;
    return Number(await this.#scripts[ADD_SPENDS](this.budgetKey(query), this.#refundsKey(query), calls, ttlMs, known));
  }

  refund(query: SpendQuery): void {
    // Not awaited: a lost refund counts one call too many, which errs on the provider's side.
    this.#scripts[REFUND](this.budgetKey(query), this.#refundsKey(query)).catch(() => undefined);
  }

  /** Per key, with the key id as its Cluster hash tag: one key's windows share a node. */
  budgetKey(query: SpendQuery): string {
    return `${this.#prefix}budget:{${query.keyId}}:${query.startMs}`;
  }

  /** The calls given back of the same window, on the same node. */
  #refundsKey(query: SpendQuery): string {
    return `${this.#prefix}refunds:{${query.keyId}}:${query.startMs}`;
  }

  async claim(upstream: string, what: string, ttlMs: number): Promise<boolean> {
    return (await this.#client.set(`${this.upstreamKey(upstream)}:claim:${what}`, '1', 'PX', ttlMs, 'NX')) === 'OK';
  }

  async close(): Promise<void> {}

  async #awaitFirstConnection(): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => (timer = setTimeout(resolve, this.#timeoutMs)));
    await Promise.race([this.#firstReady, timeout]);
    clearTimeout(timer);
  }

  /** Every key of one upstream shares this base, and so one Cluster node. */
  upstreamKey(upstream: string): string {
    return `${this.#prefix}{up:${upstream}}`;
  }
}
