-- Admission of one request (memory.rs `admit_now`): the daily budget first, then the request
-- bucket, then the token bucket; a token refusal gives the request token back.
-- KEYS: request bucket, token bucket, daily spend.
-- ARGV: rpm, tpm, tokens, budget in pico-USD (decimal, '0' = none), clock override ('' = TIME).
-- Reply: { outcome, wait_ms }: 0 admitted, 1 refused by requests, 2 by tokens, 3 by budget.
local rpm, tpm, tokens, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local now = now_ms(ARGV[5])
local day = math.floor(now / DAY_MS)

if budget ~= '0' and dec_ge(spent_on(KEYS[3], day), budget) then
  return { 3, DAY_MS - now % DAY_MS }
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

return { 0, 0 }
