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
  local lost
  local oldP, okind = tagparams(rtag)
  if oldP == nil or okind ~= rkind then
    st = alg.fresh(P, 0, now)
  else
    local old = algorithm(okind)
    local od = old.decide(old.load(key, v), oldP, 0, now)
    local used = oldP.cap - od.rem
    if used > P.cap then
      -- The conversion drops units above P's capacity: it is never
      -- stored (it could be only with a charge, and P is full), so that
      -- they do not come back as a credit to the old policy when its
      -- requests return; lost keeps what lostwait needs.
      used = P.cap
      lost = { alg = old, P = oldP, v = v }
    end
    st = alg.fresh(P, used, now)
  end
  st.rewrite = true
  st.lost = lost
  if rkind == 'l' and kind ~= 'l' then st.bad = true end
  return st
end

-- lostwait returns the retry and reset times (microseconds) of a request
-- of cost under P refused on st, a state converted with units dropped (see
-- load): the key has room for cost under P once the old policy's own
-- units in use fall to P's capacity less cost, and is whole once they are
-- all back.
local function lostwait(key, st, P, cost, now)
  local l = st.lost
  local od = l.alg.decide(l.alg.load(key, l.v), l.P, l.P.cap - P.cap + cost, now)
  return od.retry, od.reset
end
