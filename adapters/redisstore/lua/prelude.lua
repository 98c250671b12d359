-- prelude.lua: the exact integer arithmetic of the ratelimit script (the
-- rest of the helpers, which fast.lua does without, are in helpers.lua).
--
-- Lua numbers in Redis are IEEE doubles: integers are exact up to 2^53.
-- Every value here is an integer: times and durations in microseconds,
-- counts in units. Values cross the Lua boundary as decimal strings,
-- formatted with fmt (helpers.lua; tostring and '..' would use %.14g and
-- lose digits), except the policy, which comes as MessagePack integers
-- (policyargs), and the take script's reply, an array of integers.

local P53 = 9007199254740992
-- TOL is core.ClockTolerance in microseconds: a decision at most TOL behind
-- the time a key's state was written at decides as at that time, moving
-- nothing back (settle, in helpers.lua; the buckets read such a state as
-- it is, and clamp only one further ahead).
local TOL = 1000000
local floor, fmod, frexp = math.floor, math.fmod, math.frexp
local sformat, smatch, sfind, sbyte = string.format, string.match, string.find, string.byte

-- divmod returns floor(n / d) and n mod d for 0 <= n < 2^53 and
-- 0 < d < 2^53, exactly: fmod is exact, and so is the division of the
-- multiple n - r by d.
local function divmod(n, d)
  local r = fmod(n, d)
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
