-- prelude.lua: helpers shared by every algorithm of the ratelimit script.
--
-- Lua numbers in Redis are IEEE doubles: integers are exact up to 2^53.
-- Every value here is an integer: times and durations in microseconds,
-- counts in units. Values cross the Lua boundary as decimal strings,
-- formatted with fmt (tostring and '..' would use %.14g and lose digits).

local P53 = 9007199254740992
local floor, fmod, frexp = math.floor, math.fmod, math.frexp
local sformat, smatch = string.format, string.match

local function fmt(x)
  return sformat('%.0f', x)
end

-- divmod returns floor(n / d) and n mod d for 0 <= n < 2^53 and
-- 0 < d < 2^53, exactly: fmod is exact, and so is the division of the
-- multiple n - r by d.
local function divmod(n, d)
  local r = fmod(n, d)
  return (n - r) / d, r
end

-- floordiv returns floor(n / d) for any integer n and 0 < d, and the
-- remainder in [0, d).
local function floordiv(n, d)
  local r = fmod(n, d)
  if r < 0 then r = r + d end
  return (n - r) / d, r
end

-- muldiv returns floor((a*b + c) / d) and the remainder, exactly, for
-- integers 0 <= a, b, c < 2^53 and 0 < d < 2^51, provided the quotient is
-- below 2^53 (the callers' bounds guarantee it, as core's do for its
-- 128-bit mulAddDiv). When a*b + c is below 2^53 it is one division.
-- Otherwise b is consumed from its most significant end in chunks of k
-- bits, k chosen so that (2^k + 1) * d < 2^53, keeping the running
-- quotient Q and remainder R < d of a*(the bits read so far):
-- every intermediate value then stays below 2^53 and exact.
local function muldiv(a, b, c, d)
  local p = a * b
  if p < P53 then
    local s = p + c
    if s < P53 then
      return divmod(s, d)
    end
  end
  if a < b then a, b = b, a end
  local aq, ar = divmod(a, d)
  local cq, cr = divmod(c, d)
  local _, e = frexp(d) -- d < 2^e
  local k = 52 - e
  if k < 1 then k = 1 end
  local base = 2 ^ k
  local chunks, n = {}, 0
  while b > 0 do
    local hi = floor(b / base)
    n = n + 1
    chunks[n] = b - hi * base
    b = hi
  end
  local Q, R = 0, 0
  for i = n, 1, -1 do
    local ch = chunks[i]
    Q = Q * base + ch * aq
    local qq
    qq, R = divmod(R * base + ch * ar, d)
    Q = Q + qq
  end
  Q, R = Q + cq, R + cr
  if R >= d then
    Q, R = Q + 1, R - d
  end
  return Q, R
end

-- lesseq reports whether aq + ar/l <= bq + br/l for fractions in [0, l).
local function lesseq(aq, ar, bq, br)
  return aq < bq or (aq == bq and ar <= br)
end

-- ceildiff returns ceil((aq + ar/l) - (bq + br/l)) for fractions in [0, l).
local function ceildiff(aq, ar, bq, br)
  if ar > br then
    return aq - bq + 1
  end
  return aq - bq
end

-- ceilms returns ceil(us / 1000) for us >= 0.
local function ceilms(us)
  local q, r = divmod(us, 1000)
  if r > 0 then
    return q + 1
  end
  return q
end

-- keep stores value at key for life microseconds (rounded up to whole
-- milliseconds) plus slack milliseconds, or deletes the key when its state
-- already equals a fresh one. One SET with PX: value and expiry are written
-- together.
local function keep(key, value, life, slack)
  if life <= 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('SET', key, value, 'PX', fmt(ceilms(life) + slack))
end

-- getstate reads a string state tagged with tag and returns its numeric
-- fields, or nil for a missing key, a key of another type, or a value
-- written by another algorithm (read as a fresh state, and overwritten by
-- the next write).
local function getstate(key, pattern)
  local v = redis.pcall('GET', key)
  if type(v) ~= 'string' then
    return nil
  end
  return smatch(v, pattern)
end

-- modules holds one constructor per algorithm (see gcra.lua and the
-- others), each returning a table of load, decide, commit and refund.
local modules = {}

local function newdecision()
  return { allowed = false, rem = 0, reset = 0, retry = 0, delay = 0, extra = 0 }
end
