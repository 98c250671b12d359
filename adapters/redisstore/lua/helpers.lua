-- helpers.lua: the helpers shared by every algorithm of the ratelimit
-- script, after fast.lua, which decides its requests without them (a
-- closure made is a cost paid by every call).

-- floordiv returns floor(n / d) for any integer n and 0 < d, and the
-- remainder in [0, d).
local function floordiv(n, d)
  local r = fmod(n, d)
  if r < 0 then r = r + d end
  return (n - r) / d, r
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

-- policyargs decodes a policy argument (policyArg in policy.go: the
-- algorithm's code, then W, L, cap, maxDelay, tauQ and tauR, each an exact
-- integer below 2^53, in MessagePack); it returns nothing for anything
-- else.
local function policyargs(s)
  local ok, a, w, l, cap, md, tq, tr = pcall(cmsgpack.unpack, s)
  if ok and type(a) == 'string' and type(w) == 'number' and type(l) == 'number'
      and type(cap) == 'number' and type(md) == 'number' and type(tq) == 'number'
      and type(tr) == 'number' then
    return a, w, l, cap, md, tq, tr
  end
end

-- modules holds one constructor per algorithm (see gcra.lua and the
-- others), each returning a table of load, decide, commit and refund.
local modules = {}

local function newdecision()
  return { allowed = false, rem = 0, reset = 0, retry = 0, delay = 0, extra = 0 }
end
