-- helpers.lua: the helpers shared by every algorithm of the ratelimit
-- script, after fast.lua, which decides its requests without them (a
-- closure made is a cost paid by every call).

-- Lua 5.1's '%d' converts through a C long: exact for every integer below
-- 2^53 where long has 64 bits (it has on every 64-bit Unix), and several
-- times cheaper than '%.0f'. I64 says whether it is here; every format
-- picks '%d' only then.
local I64 = sformat('%d', P53) == '9007199254740992'

local function fmt(x)
  if I64 then
    return sformat('%d', x)
  end
  return sformat('%.0f', x)
end

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
-- milliseconds) plus slack milliseconds. A state that already equals a
-- fresh one is deleted on the server's clock (slack 1), and kept for the
-- slack in ClientTime mode, as a state that became whole with time is: a
-- caller's clock behind now would read its units again. One SET with PX:
-- value and expiry are written together.
local function keep(key, value, life, slack)
  if life <= 0 then
    if slack <= 1 then
      redis.call('DEL', key)
      return
    end
    life = 0
  end
  redis.call('SET', key, value, 'PX', fmt(ceilms(life) + slack))
end

-- WINDOWTTL says whether a record rewritten within the window its expiry
-- was set for keeps that expiry (keepttl): on the server's clock, where
-- the window ends when the expiry says, and on Redis 7 and later (scripts
-- see redis.REDIS_VERSION_NUM there; SET's KEEPTTL is Redis 6). In
-- ClientTime mode every write sets the expiry from the caller's time.
local WINDOWTTL = ARGV[2] == '' and redis.REDIS_VERSION_NUM ~= nil

-- keepttl stores value at key, keeping the key's expiry: one SET with
-- KEEPTTL, about half the server time of one with PX, and no expiry to
-- format.
local function keepttl(key, value)
  redis.call('SET', key, value, 'KEEPTTL')
end

-- getstate matches a string state v (a GET's reply) against pattern and
-- returns its numeric fields, or nil for anything else.
local function getstate(v, pattern)
  if type(v) ~= 'string' then
    return nil
  end
  return smatch(v, pattern)
end

-- policyargs decodes a policy argument (policyArg in policy.go: the
-- algorithm's code, the identity tag, then W, L, cap, maxDelay, tauQ and
-- tauR, each an exact integer below 2^53, in MessagePack); it returns
-- nothing for anything else.
local function policyargs(s)
  local ok, a, tag, w, l, cap, md, tq, tr = pcall(cmsgpack.unpack, s)
  if ok and type(a) == 'string' and type(tag) == 'string' and type(w) == 'number'
      and type(l) == 'number' and type(cap) == 'number' and type(md) == 'number'
      and type(tq) == 'number' and type(tr) == 'number' then
    return a, tag, w, l, cap, md, tq, tr
  end
end

-- modules holds one constructor per algorithm (see gcra.lua and the
-- others), each returning a table of load, fresh, decide, commit, save and
-- refund.
local modules = {}

local function newdecision()
  return { allowed = false, rem = 0, reset = 0, retry = 0, delay = 0, extra = 0 }
end

-- settle returns the time to decide at for a decision at now on a state
-- last written at at (or later): at itself when now lies behind it by at
-- most TOL, as core's settle; now otherwise. The durations a decision
-- reports still count from now.
local function settle(now, at)
  if at > now and at - now <= TOL then
    return at
  end
  return now
end

-- typed returns v, the reply of a redis.pcall read of a key that may hold
-- another type. Only WRONGTYPE is an answer (the key holds another type);
-- any other error (NOPERM from an ACL that denies the read, ...) is
-- raised, as redis.call raises it: read as a missing key, it would give
-- every request a fresh quota.
local function typed(v)
  if type(v) == 'table' and v.err ~= nil and sfind(v.err, 'WRONGTYPE', 1, true) ~= 1 then
    error(v)
  end
  return v
end

-- record reads what key holds: the GET reply v (a string state, or false
-- for a missing key), the state's kind ('g', 'f', 'c' or 'l', the code of
-- the algorithm module that wrote it; nil for a missing key or anything
-- else) and its identity tag ('' for a record without one, which this
-- store never writes).
local function record(key)
  local v = typed(redis.pcall('GET', key))
  if type(v) == 'string' then
    local kind = smatch(v, '^([gfc]):')
    if kind == nil then
      return v, nil, ''
    end
    return v, kind, smatch(v, ';([^;]*)$') or ''
  end
  if type(v) == 'table' then
    -- WRONGTYPE: the sliding log's list, or a foreign type
    local head = typed(redis.pcall('LINDEX', key, 0))
    if type(head) == 'string' and smatch(head, '^%d+') then
      return v, 'l', smatch(head, ';([^;]*)$') or ''
    end
    return v, nil, ''
  end
  return false, nil, ''
end

-- tagparams returns the parameters of the policy an identity tag names
-- (see identityTag in policy.go), as a table like a request's P, and the
-- code of its state's module; nil for a malformed tag.
local tagkinds = { t = 'g', k = 'g', f = 'f', c = 'c', l = 'l' }
local function tagparams(tag)
  local id, l, w, cap = smatch(tag, '^(%a),(%d+),(%d+),(%d+)$')
  if id == nil or tagkinds[id] == nil then
    return nil
  end
  l, w, cap = tonumber(l), tonumber(w), tonumber(cap)
  if l == nil or w == nil or cap == nil or l < 1 or w < 1 or cap < 1
      or l >= P53 or w >= P53 or cap >= P53 then
    return nil
  end
  local tq, tr = muldiv(cap, w, 0, l)
  return { W = w, L = l, cap = cap, maxDelay = 0, tauQ = tq, tauR = tr, tag = tag }, tagkinds[id]
end
