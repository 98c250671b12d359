-- arith.lua: the exact integer arithmetic of the ratelimit script (divmod,
-- and muldiv for products past 2^53), after fast.lua so that the usual
-- decision makes no closure (see prelude.lua for the numbers'
-- conventions).

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
