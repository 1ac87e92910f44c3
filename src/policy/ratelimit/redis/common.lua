-- legate rate limits: the arithmetic of bucket.rs and memory.rs, for the Redis scripts.
-- Prepended to admit.lua and settle.lua; each script runs atomically on the server.
--
-- Numbers are Lua doubles. Every value kept here is an integer below 2^53 (the Rust side clamps
-- limits and token counts to 10^11, so a full bucket holds at most 6 * 10^15 units), so the
-- doubles are exact and the results equal the i128 arithmetic of bucket.rs. Spend is never a Lua
-- number: it stays a decimal string and grows with HINCRBY (a signed 64-bit integer).

-- Scripts that read TIME and then write need effect replication on Redis before 5.
if redis.replicate_commands then
  redis.replicate_commands()
end

local UNITS = 60000
local DAY_MS = 86400000
-- An absent bucket starts full, so a bucket's keys may vanish once it would be full again.
local IDLE_MARGIN_MS = 60000
-- bucket.rs CLOCK_STEP_MS.
local CLOCK_STEP_MS = 2000
-- A day's spend outlives the day so that a late settlement still finds it.
local SPEND_TTL_MS = 2 * DAY_MS
local SPEND_MAX = '9223372036854775807'
-- The wait a refusal by the budget held in flight asks for (mod.rs HELD_WAIT_MS).
local HELD_WAIT_MS = 1000

local function int(x)
  return string.format('%.0f', x)
end

-- The clock: the server's TIME, so that replicas with skewed clocks agree.
local function now_ms(override)
  if override ~= '' then
    return tonumber(override)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A number a bucket can hold: finite (tonumber reads 'nan' and 'inf' too, which would be
-- written back and fail PEXPIRE on every later call).
local function finite(x)
  return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge
end

local function load(key, limit, now)
  local v = redis.call('HMGET', key, 'level', 'last_ms')
  local level, last = tonumber(v[1]), tonumber(v[2])
  if not finite(level) or not finite(last) then
    return { level = limit * UNITS, last = now }
  end
  return { level = level, last = last }
end

local function save(key, b, limit)
  redis.call('HSET', key, 'level', int(b.level), 'last_ms', int(b.last))
  local to_full = math.ceil((limit * UNITS - b.level) / limit)
  redis.call('PEXPIRE', key, int(math.max(to_full, 0) + IDLE_MARGIN_MS))
end

local function refill(b, limit, now)
  local cap = limit * UNITS
  local elapsed = math.max(now - b.last, 0)
  b.level = math.min(b.level + elapsed * limit, cap)
  -- A time far ahead of the clock (the clock stepped back, or the key was written wrong) is
  -- not kept: kept, the bucket would refill only once the clock caught up with it. One a
  -- little ahead is, as bucket.rs keeps it (CLOCK_STEP_MS).
  if b.last <= now + CLOCK_STEP_MS then
    b.last = math.max(b.last, now)
  else
    b.last = now
  end
end

-- Takes n tokens and returns nil, or returns the milliseconds until they would be there.
local function take(b, limit, n, now)
  refill(b, limit, now)
  local need = n * UNITS
  if b.level >= need then
    b.level = b.level - need
    return nil
  end
  local rate = math.max(limit, 1)
  return math.floor((need - b.level + rate - 1) / rate)
end

-- Gives n tokens back (a refund), or takes them (a debit) when n is negative.
local function give(b, limit, n, now)
  refill(b, limit, now)
  b.level = math.min(b.level + n * UNITS, limit * UNITS)
end

-- The pico-dollars spent on UTC day `day`, as a decimal string.
local function spent_on(key, day)
  local v = redis.call('HMGET', key, 'day', 'pico')
  if v[1] == int(day) and v[2] then
    return v[2]
  end
  return '0'
end

-- a >= b for decimal strings of digits without leading zeros (no locale-dependent compare).
local function dec_ge(a, b)
  if #a ~= #b then
    return #a > #b
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x > y
    end
  end
  return true
end

-- a + b for decimal strings of digits without leading zeros.
local function dec_add(a, b)
  local out, carry = {}, 0
  local i, j = #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local x = i > 0 and string.byte(a, i) - 48 or 0
    local y = j > 0 and string.byte(b, j) - 48 or 0
    local s = x + y + carry
    out[#out + 1] = string.char(48 + s % 10)
    carry = math.floor(s / 10)
    i, j = i - 1, j - 1
  end
  if #out == 0 then
    return '0'
  end
  return string.reverse(table.concat(out))
end

-- Adds n (a decimal string, '-' in front to subtract) to the spend hash's `held` sum,
-- saturating at the int64 maximum as the spend does.
local function add_held(spent_key, n)
  local r = redis.pcall('HINCRBY', spent_key, 'held', n)
  if type(r) == 'table' and r.err then
    redis.call('HSET', spent_key, 'held', SPEND_MAX)
  end
end

-- How many lapsed holds one call drops, so that no call runs long: after a replica with many
-- requests in flight is lost, the rest go in the calls after it (each refused call drops its
-- share too), and meanwhile the budget is held a little longer.
local LAPSED_PER_CALL = 64

-- The pico-dollars held by requests in flight, as a decimal string, once the holds that
-- lapsed by `now` (their settlement lost) are dropped.
local function held_now(spent_key, held_key, now)
  local lapsed = redis.call('ZRANGEBYSCORE', held_key, '-inf', int(now), 'LIMIT', 0, LAPSED_PER_CALL)
  for _, member in ipairs(lapsed) do
    redis.call('ZREM', held_key, member)
    local pico = string.match(member, ':(%d+)$')
    if pico then
      add_held(spent_key, '-' .. pico)
    end
  end
  -- No member left (all settled or lapsed, or the set evicted): nothing is held, whatever
  -- the sum says, so no drift in it can outlive the holds.
  if redis.call('ZCARD', held_key) == 0 then
    redis.call('HDEL', spent_key, 'held')
    return '0'
  end
  local h = redis.call('HGET', spent_key, 'held')
  local n = tonumber(h)
  if n == nil or n <= 0 then
    return '0'
  end
  return h
end
