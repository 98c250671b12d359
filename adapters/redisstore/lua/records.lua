-- records.lua: what the take script (main.lua) and the peek/refund script
-- (ops.lua) share: the decision time, the algorithm modules by code, and
-- load, which reads a key's record under a policy, converting a record
-- written under another policy. Both scripts take now as ARGV[2].

-- Redis 5+ replicates scripts by their effects, so writing after TIME is
-- allowed; Redis 3.2 and 4 need to be asked (a no-op later).
if redis.replicate_commands then redis.replicate_commands() end

local codes = { g = 'gcra', f = 'fixed', c = 'counter', l = 'swlog' }
local made = {}
local function algorithm(code)
  local name = codes[code]
  if name == nil then
    return nil
  end
  local m = made[name]
  if m == nil then
    m = modules[name]()
    made[name] = m
  end
  return m
end

local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end

-- load returns the state of key under the policy P of algorithm module
-- alg (code kind), converting a record written under another policy.
local function load(key, alg, kind, P)
  local v, rkind, rtag = record(key)
  if rkind == nil then
    if v then
      -- a foreign value: read as fresh, replaced by the next write
      local st = alg.fresh(P, 0, now)
      st.bad = true
      return st
    end
    return alg.load(key, v)
  end
  if rtag == P.tag then
    local st = alg.load(key, v)
    st.own = true -- written by this policy (see fixed.commit)
    return st
  end
  if rtag == '' and rkind == kind then
    return alg.load(key, v)
  end
  local st
  local old, lost
  local oldP, okind = tagparams(rtag)
  if oldP == nil or okind ~= rkind then
    st = alg.fresh(P, 0, now)
  else
    local oalg = algorithm(okind)
    local ost = oalg.load(key, v)
    -- at: the old record's own time when now lies behind it by at most TOL
    -- (settle: a window's start, a log's newest entry), where the units
    -- carried over are recorded: at now, they would go to a window or
    -- instant before the record's, which the next decision at its time
    -- would find over (core's stateTime). A bucket's is now: its TAT does
    -- not say when its last decision was made. A bucket P starts to give
    -- the units back at now (ahead of now, it would read them as more than
    -- it holds).
    local at = now
    if kind == 'g' then
      -- at now
    elseif okind == 'f' then
      if ost.B > 0 then at = settle(now, ost.A * oldP.W) end
    elseif okind == 'c' then
      if ost.prev > 0 or ost.curr > 0 then at = settle(now, ost.A * oldP.W) end
    elseif okind == 'l' then
      if ost.len > 0 then at = settle(now, ost.newest) end
    end
    local od = oalg.decide(ost, oldP, 0, now)
    local used = oldP.cap - od.rem
    if okind == 'g' and sbyte(rtag) == 107 and not ost.fresh and ost.A >= now then -- 'k'
      -- A shaping bucket's queue beyond its capacity is in use too. The
      -- tag does not carry MaxDelay (nor does an identity), so the units
      -- in use are read from the arrival time itself: ceil((TAT - now) x
      -- L / W), which a clock stepped back can only make more. (A token
      -- bucket's, 't', has no MaxDelay: its decision at cost 0 above
      -- reads it clamped at now + tau, as the memory store does.)
      local q, r = muldiv(ost.A - now, oldP.L, ost.B, oldP.W)
      if r > 0 then q = q + 1 end
      if q > used then used = q end
    end
    -- A conversion is stored only with a charge (so that the old
    -- policy's requests find its record as they left it when they
    -- return); one that drops units above P's capacity is refused
    -- (convrefuse). old keeps what convrefuse needs.
    old = { alg = oalg, kind = okind, P = oldP, v = v }
    if used > P.cap then
      used = P.cap
      lost = true
    end
    st = alg.fresh(P, used, at)
  end
  st.rewrite = true
  st.converted = true -- from another policy's record
  st.old, st.lost = old, lost
  if rkind == 'l' and kind ~= 'l' then st.bad = true end
  return st
end

-- convrefuse makes d, a refusal of a request of cost under P on st, a
-- state converted from another policy's record (see load), the refusal
-- the take script reports without storing the conversion: with st.lost,
-- one that dropped units, whatever P decided (also a shaping P, which
-- would admit a full bucket with a delay). The key has room for cost under
-- P once the old policy's own units in use, queued ones included, fall to
-- P's capacity less cost, and is whole once they are all back. The old
-- record of a window, clamped as its own decision at now clamps it after a
-- clock stepped back, is written, so that the wait holds.
local function convrefuse(key, st, P, cost, now, d, slack)
  local l = st.old
  local ost = l.alg.load(key, l.v)
  local wait, reset = 0, 0
  if l.kind == 'g' and sbyte(l.P.tag) == 107 then -- 'k', a leaky bucket
    -- From the arrival time itself (see load), which a clamp would cut
    -- without the MaxDelay the tag does not carry: cost fits once TAT - t
    -- <= (P's capacity - cost) x W / L.
    if not ost.fresh then
      local xq, xr = muldiv(P.cap - cost, l.P.W, 0, l.P.L)
      local a, b = ost.A - xq, ost.B - xr
      if b < 0 then a, b = a - 1, b + l.P.L end
      wait = a - now
      if b > 0 then wait = wait + 1 end
      reset = ost.A - now
      if ost.B > 0 then reset = reset + 1 end
    end
  else
    local z = l.alg.decide(ost, l.P, 0, now)
    if z.clamped then
      l.alg.saveclamped(key, ost, l.P, now, z, slack)
      -- Read again: a sliding log's state reads its list lazily, and the
      -- clamp rewrote it (the others decide on it as clamped anyway).
      ost = l.alg.load(key, l.v)
    end
    reset = z.reset
    local k = l.P.cap - P.cap + cost
    if k >= 1 then
      wait = l.alg.decide(ost, l.P, k, now).retry
    end
  end
  if wait < 1 then wait = 1 end
  d.allowed, d.delay, d.retry = false, 0, wait
  if st.lost then d.rem = 0 end
  if reset > d.reset then d.reset = reset end
end
