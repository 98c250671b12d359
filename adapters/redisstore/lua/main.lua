-- main.lua: decides a batch of requests, one per key of KEYS.
--
-- ARGV[1] mode: 'T' take (decide all; charge all only if all are admitted),
--               'C' check (decide all, charge nothing, report as refused;
--                   a record converted or clamped is written as a refused
--                   take writes it),
--               'R' refund (undo the charges of an earlier 'T').
-- ARGV[2] now in Unix microseconds, or '' to read the server's TIME.
-- ARGV[3] 1-based index of a request whose cost exceeds its capacity, or 0.
-- ARGV[4] milliseconds added to every key's expiry.
-- Then three arguments per request: the policy (alg tag W L cap maxDelay
-- tauQ tauR, times in microseconds, as MessagePack: see policyargs), the
-- cost, and (for 'R') what the charge reported. (A single take comes with
-- fast.lua's short arguments, in this form once shortargs.lua has run.)
--
-- Every record carries the identity tag of the policy that wrote it. A
-- record written under another policy (another tag) is never read under
-- this one: the units it has in use under its own policy, at now, carry
-- over to a fresh state of this policy (at most its capacity), which is
-- then decided as usual and written only with a charge: a refused request
-- leaves the other policy's record as it was, with a retry time from it,
-- and a conversion that dropped units above this policy's capacity is
-- refused (see load and convrefuse). A record without a tag (which this
-- store never writes) is read under the requesting policy if it has the
-- same algorithm's state, and as fresh otherwise.
--
-- The reply is an array of integers (Redis converts Lua numbers to
-- integers, exact below 2^53, without the cost of formatting them): now,
-- then per request allowed (0/1), remaining, resetAfter, retryAfter, delay
-- (in microseconds) and extra (the charge's window index or instant, for
-- 'R').

local mode = ARGV[1]
local over, slack = tonumber(ARGV[3]), tonumber(ARGV[4])

local modcodes = { g = 'g', f = 'f', c = 'c', l = 'l' }

local n = #KEYS
local reqs = {}
for i = 1, n do
  local base = 5 + 3 * (i - 1)
  local a, tag, w, l, cap, md, tq, tr = policyargs(ARGV[base])
  local alg = algorithm(a)
  if alg == nil or tr == nil then
    return redis.error_reply('ERR ratelimit: bad policy argument ' .. i)
  end
  local P = { W = w, L = l, cap = cap, maxDelay = md, tauQ = tq, tauR = tr, tag = tag }
  reqs[i] = { key = KEYS[i], alg = alg, kind = modcodes[a], P = P, cost = tonumber(ARGV[base + 1]),
    extra = tonumber(ARGV[base + 2]), st = load(KEYS[i], alg, modcodes[a], P) }
end

-- A single request taken alone (the usual decision): decide, charge if
-- admitted, and reply in one format, as the batch logic below would.
if n == 1 and mode == 'T' and over == 0 then
  local r = reqs[1]
  local d = r.alg.decide(r.st, r.P, r.cost, now)
  local a = 0
  if r.st.old and (r.st.lost or not d.allowed) then
    convrefuse(r.key, r.st, r.P, r.cost, now, d, slack) -- not stored (see load)
  elseif d.allowed then
    a = 1
    d.extra = r.alg.commit(r.key, r.st, r.P, r.cost, now, d, slack)
  elseif r.st.rewrite then
    r.alg.save(r.key, r.st, r.P, now, slack)
  elseif d.clamped then
    r.alg.saveclamped(r.key, r.st, r.P, now, d, slack)
  end
  return { now, a, d.rem, d.reset, d.retry, d.delay, d.extra }
end

local out = {}

local function reply()
  local r = { now }
  for i = 1, n do
    local d = out[i]
    local a = 0
    if d.allowed then a = 1 end
    local b = 6 * (i - 1) + 1
    r[b + 1], r[b + 2], r[b + 3], r[b + 4], r[b + 5], r[b + 6] = a, d.rem, d.reset, d.retry, d.delay, d.extra
  end
  return r
end

if mode == 'R' then
  for i = 1, n do
    local r = reqs[i]
    r.alg.refund(r.key, r.st, r.P, r.cost, r.extra, now, slack)
    local d = r.alg.decide(load(r.key, r.alg, r.kind, r.P), r.P, 0, now)
    d.allowed = true
    out[i] = d
  end
  return reply()
end

-- Decide every request without writing; every request over its capacity
-- (ARGV[3] names the first) at cost 0, refused with no retry time.
local all = true
for i = 1, n do
  local r = reqs[i]
  local cost, big = r.cost, r.cost > r.P.cap
  if big then cost = 0 end
  local d = r.alg.decide(r.st, r.P, cost, now)
  if big then
    d.allowed = false
    d.retry = 0
  elseif r.st.old and (r.st.lost or not d.allowed) then -- refused (see load)
    convrefuse(r.key, r.st, r.P, cost, now, d, slack)
  end
  out[i] = d
  all = all and d.allowed
end

if all and mode == 'T' then
  -- Charge every request: the decisions stand as made.
  for i = 1, n do
    local r = reqs[i]
    out[i].extra = r.alg.commit(r.key, r.st, r.P, r.cost, now, out[i], slack)
  end
  return reply()
end

-- Refused (or only checked): nothing is charged, and the requests that
-- would have passed report their state without their cost. A refused take
-- and a check still write the states of their own policy clamped after a
-- clock stepped back (and records without a tag, rewritten), as
-- the memory store's decision at cost 0 does: neither changes a decision
-- at now, and the clamp's bound must hold from the first decision after
-- the step, on whichever path (a request over capacity, a batch spanning
-- several slots) it came. A state converted from another policy's is
-- written only with a charge (see load).
do
  for i = 1, n do
    local r = reqs[i]
    if r.st.old then
      -- a conversion is stored only with a charge (see load)
    elseif r.st.rewrite then
      r.alg.save(r.key, r.st, r.P, now, slack)
    elseif out[i].clamped then
      r.alg.saveclamped(r.key, r.st, r.P, now, out[i], slack)
    end
  end
end
for i = 1, n do
  if out[i].allowed then
    local r = reqs[i]
    local extra = out[i].extra
    out[i] = r.alg.decide(r.st, r.P, 0, now)
    out[i].allowed = true
    out[i].extra = extra
  end
end
return reply()
