-- Settlement of one admitted request (memory.rs `settle_now`): tokens refunded or debited, and
-- the cost added to the UTC day's spend (saturating at the int64 maximum), and the request's
-- hold against the budget released.
-- KEYS: token bucket, daily spend, request bucket, holds.
-- ARGV: tpm, refund in tokens (signed), cost in pico-USD (decimal, at most int64),
--       rpm, 1 to give the request back (nothing was sent upstream) else 0,
--       hold in pico-USD (decimal, '0' = none), the hold's member, clock override ('' = TIME),
--       credit in pico-USD (decimal, at most int64, '0' = none) and the UTC day it is taken
--       from (mod.rs `Resettle`).
local tpm, refund, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local rpm, request_back = tonumber(ARGV[4]), ARGV[5] == '1'
local hold, member = ARGV[6], ARGV[7]
local now = now_ms(ARGV[8])
local credit, credit_day = ARGV[9] or '0', ARGV[10]

-- A hold already dropped as lapsed was taken off the sum then.
if hold ~= '0' and redis.call('ZREM', KEYS[4], member) == 1 then
  add_held(KEYS[2], '-' .. hold)
end

if rpm > 0 and request_back then
  local b = load(KEYS[3], rpm, now)
  give(b, rpm, 1, now)
  save(KEYS[3], b, rpm)
end

if tpm > 0 and refund ~= 0 then
  local b = load(KEYS[1], tpm, now)
  give(b, tpm, refund, now)
  save(KEYS[1], b, tpm)
end

local charged_day = 0
if cost ~= '0' then
  charged_day = math.floor(now / DAY_MS)
  local day = int(charged_day)
  if redis.call('HGET', KEYS[2], 'day') ~= day then
    redis.call('HSET', KEYS[2], 'day', day, 'pico', '0')
  end
  local r = redis.pcall('HINCRBY', KEYS[2], 'pico', cost)
  if type(r) == 'table' and r.err then
    redis.call('HSET', KEYS[2], 'pico', SPEND_MAX)
  end
  redis.call('PEXPIRE', KEYS[2], int(SPEND_TTL_MS))
end

-- A credit lowers the spend of the day it was charged to, never another's, never below zero,
-- and never a spend that saturated: that sum no longer says what was charged.
if credit ~= '0' and redis.call('HGET', KEYS[2], 'day') == credit_day
    and redis.call('HGET', KEYS[2], 'pico') ~= SPEND_MAX then
  local r = redis.pcall('HINCRBY', KEYS[2], 'pico', '-' .. credit)
  if type(r) ~= 'number' or r < 0 then
    redis.call('HSET', KEYS[2], 'pico', '0')
  end
end

-- The day the cost went to (0: none), for a credit of it later (mod.rs `Resettle`).
return charged_day
