-- Admission of one request (memory.rs `admit_now`): the daily budget first (its settled spend,
-- then the holds of requests in flight), then the request bucket, then the token bucket; a
-- token refusal gives the request token back; an admission holds its estimated cost.
-- KEYS: request bucket, token bucket, daily spend, holds.
-- ARGV: rpm, tpm, tokens, budget in pico-USD (decimal, '0' = none), hold in pico-USD
--       (decimal, '0' = none), the hold's member, its lifetime in ms, clock override
--       ('' = TIME).
-- Reply: { outcome, wait_ms }: 0 admitted, 1 refused by requests, 2 by tokens, 3 by budget,
--        4 by the budget held by requests in flight.
local rpm, tpm, tokens, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local hold, member, hold_ms = ARGV[5], ARGV[6], tonumber(ARGV[7])
local now = now_ms(ARGV[8])
local day = math.floor(now / DAY_MS)
local holding = budget ~= '0' and hold ~= '0'

if budget ~= '0' then
  local spent = spent_on(KEYS[3], day)
  if dec_ge(spent, budget) then
    return { 3, DAY_MS - now % DAY_MS }
  end
  if holding then
    -- A request is admitted alone whatever its estimate, as one was before holds.
    local held = held_now(KEYS[3], KEYS[4], now)
    if held ~= '0' and not dec_ge(budget, dec_add(dec_add(spent, held), hold)) then
      return { 4, HELD_WAIT_MS }
    end
  end
end

local req
if rpm > 0 then
  req = load(KEYS[1], rpm, now)
  local wait = take(req, rpm, 1, now)
  save(KEYS[1], req, rpm)
  if wait then
    return { 1, wait }
  end
end

if tpm > 0 then
  local tok = load(KEYS[2], tpm, now)
  local wait = take(tok, tpm, tokens, now)
  save(KEYS[2], tok, tpm)
  if wait then
    -- Both limits or neither.
    if req then
      give(req, rpm, 1, now)
      save(KEYS[1], req, rpm)
    end
    return { 2, wait }
  end
end

if holding then
  redis.call('ZADD', KEYS[4], int(now + hold_ms), member)
  add_held(KEYS[3], hold)
  -- The set lives as long as the sum beside it: a set gone before its sum would leave
  -- the sum holding what no member can take off any more.
  redis.call('PEXPIRE', KEYS[4], int(SPEND_TTL_MS))
  redis.call('PEXPIRE', KEYS[3], int(SPEND_TTL_MS))
end

return { 0, 0 }
