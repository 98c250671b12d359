-- ops.lua: peeks at and refunds a batch of requests, one per key of KEYS,
-- with the algorithm modules of the take script (see ops.go).
--
-- ARGV[1] mode: 'P' peek (decide every request at its cost and at cost 0,
--               write nothing but a record of the request's policy left
--               ahead of a clock that stepped back, clamped),
--               'F' refund (give back each request's cost, as defined per
--               algorithm in refunders below; never more than is in use).
-- ARGV[2] now in Unix microseconds, or '' to read the server's TIME.
-- ARGV[3] milliseconds added to every key's expiry.
-- Then three arguments per request: the policy (as for the take script,
-- see policyargs), the cost, and, for 'F', the time of the charge it gives
-- back in Unix microseconds, on the clock of now ('' when not known).
--
-- A record written under another policy (another identity tag) is read as
-- the take script reads it: the units in use under its own policy carry
-- over to a fresh state of the request's policy. A peek writes only a
-- record left ahead of a clock that stepped back, clamped as every
-- decision writes it (its own policy's, or the other policy's record a
-- refused conversion reads). A refund without a charge time converts the
-- record, then gives back, unless the conversion drops units (nothing is
-- then stored); one with a charge time gives nothing back on another
-- policy's record.
--
-- The reply is one string of integers separated by spaces: now, then, for
-- 'P', per request allowed (0/1), remaining, resetAfter, retryAfter and
-- delay at the request's cost, then remaining, resetAfter and delay at
-- cost 0 (times in microseconds).

local mode, slack = ARGV[1], tonumber(ARGV[3])

-- The sliding log's entries "t:n:c" (see sliding_log.lua).
local LOGM = 4503599627370496 -- 2^52, the modulus of the running counts
local function parse_log_entry(s)
  if type(s) ~= 'string' then
    return nil
  end
  local t, n, c = smatch(s, '^(%-?%d+):(%d+):(%d+)$')
  return tonumber(t), tonumber(n), tonumber(c)
end
local function log_entry_string(t, n, c)
  return sformat(I64 and '%d:%d:%d' or '%.0f:%.0f:%.0f', t, n, c)
end

-- refunders give back up to cost units of st at now and write the result
-- (deleting a key left whole), mirroring the Refund methods of core, and,
-- given at, the time of the charge they give back, its RefundCharge
-- methods: only what that charge still holds.
local refunders = {}

-- The buckets move TAT back by cost x W/L, never before now; a TAT beyond
-- now + tau + MaxDelay by more than TOL (the clock stepped back) is first
-- clamped there.
-- Given at (when the charge began to give its units back), less now - at,
-- what it has given back since, and nothing from a TAT ahead of the clock.
function refunders.g(alg, key, st, P, cost, at)
  if st.fresh or st.A < now or (st.A == now and st.B == 0) then
    if st.rewrite or st.bad then alg.save(key, st, P, now, slack) end
    return
  end
  local aq, ar = st.A, st.B
  local mq = now + P.tauQ + P.maxDelay
  if not lesseq(aq, ar, mq + TOL, P.tauR) then
    if at ~= nil then
      if st.rewrite or st.bad then alg.save(key, st, P, now, slack) end
      return -- which charges a TAT ahead of the clock holds is unknown
    end
    aq, ar = mq, P.tauR
  end
  local q, r = muldiv(cost, P.W, 0, P.L)
  if at ~= nil and at < now then
    local elapsed = now - at
    if q < elapsed or (q == elapsed and r == 0) then
      if st.rewrite or st.bad then alg.save(key, st, P, now, slack) end
      return -- the charge has given back all it held
    end
    q = q - elapsed
  end
  local A, B = aq - q, ar - r
  if B < 0 then
    A, B = A - 1, B + P.L
  end
  if lesseq(A, B, now, 0) then
    alg.save(key, { A = 0, B = 0, fresh = true }, P, now, slack)
    return
  end
  alg.save(key, { A = A, B = B }, P, now, slack)
end

-- A fixed window gives back from the current window's count (given at,
-- only if the charge went to the current window); a window in the future
-- (the clock stepped back) counts as the current one.
function refunders.f(alg, key, st, P, cost, at)
  local idx = floordiv(now, P.W)
  if st.B > 0 then idx = floordiv(settle(now, st.A * P.W), P.W) end
  if at ~= nil then
    -- only the count of the charge's window, while the state holds it and
    -- it is not over (a later window's holds later charges)
    if st.B > 0 and floordiv(at, P.W) == st.A and idx <= st.A then
      local b = st.B - cost
      if b < 0 then b = 0 end
      alg.save(key, { A = st.A, B = b }, P, now, slack)
    elseif st.rewrite or st.bad then
      alg.save(key, st, P, now, slack)
    end
    return
  end
  if st.B > 0 and idx <= st.A then
    local b = st.B - cost
    if b < 0 then b = 0 end
    alg.save(key, { A = idx, B = b }, P, now, slack)
  elseif st.rewrite or st.bad then
    alg.save(key, st, P, now, slack)
  end
end

-- A sliding counter gives back from the current window's count, then the
-- previous one's; given at, only from the count of the window the charge
-- went to (the current or the previous one).
function refunders.c(alg, key, st, P, cost, at)
  local idx = floordiv(now, P.W)
  if st.prev > 0 or st.curr > 0 then idx = floordiv(settle(now, st.A * P.W), P.W) end
  local prev, curr = 0, 0
  if idx == st.A then
    prev, curr = st.prev, st.curr
  elseif idx < st.A then
    -- a window in the future (the clock stepped back) counts whole as
    -- now's (see swc_counts)
    curr = st.prev + st.curr
    if curr > P.cap then curr = P.cap end
  elseif idx == st.A + 1 then
    prev = st.curr
  end
  if at == nil then
    if prev == 0 and curr == 0 then
      if st.rewrite or st.bad or st.prev > 0 or st.curr > 0 then
        redis.call('DEL', key)
      end
      return
    end
    local k = cost
    if k > curr then k = curr end
    curr = curr - k
    k = cost - k
    if k > prev then k = prev end
    prev = prev - k
    alg.save(key, { A = idx, prev = prev, curr = curr }, P, now, slack)
    return
  end
  -- only the count of the window the charge went to, as the state holds it
  -- (its own window's or the one before; a later window's holds none),
  -- whole at now or not: the counts a clock stepping back would read again
  -- stay as they are
  local iat, sp, sc = floordiv(at, P.W), st.prev, st.curr
  if iat == st.A then
    sc = sc - cost
    if sc < 0 then sc = 0 end
  elseif iat == st.A - 1 then
    sp = sp - cost
    if sp < 0 then sp = 0 end
  else
    if st.rewrite or st.bad then alg.save(key, st, P, now, slack) end
    return
  end
  alg.save(key, { A = st.A, prev = sp, curr = sc }, P, now, slack)
end

-- A sliding log removes its most recent entries inside the window (those
-- recorded after now count as made at now), up to cost units; given at,
-- only from the entry of the charge's instant, while it is in the log.
function refunders.l(alg, key, st, P, cost, at)
  if st.len == 0 then
    -- nothing in use: a record of another shape, or another policy's
    -- converted to nothing, is replaced by nothing, as the other
    -- algorithms' refunds and the memory store replace it
    if st.bad or st.rewrite then redis.call('DEL', key) end
    return
  end
  if at ~= nil then
    -- the entry of the charge's instant (see sliding_log.lua); a converted
    -- or previous-version state has no entry of its own charges
    if st.virt or st.bad then
      if st.rewrite or st.bad then alg.save(key, st, P, now, slack) end
    else
      alg.refund(key, st, P, cost, at, now, slack)
    end
    return
  end
  local cutoff = now - P.W
  if st.virt or st.bad then
    -- a converted or previous-version state: at most one entry, rewritten
    local t, n = st.t[1], st.n[1]
    if t <= cutoff then
      n = 0
    else
      n = n - cost
      if n < 0 then n = 0 end
    end
    if n == 0 then
      redis.call('DEL', key)
      return
    end
    alg.save(key, { len = 1, base = 0, virt = true, t = { t }, n = { n }, c = { n },
      newest = t, newestN = n, newestC = n, rewrite = true }, P, now, slack)
    return
  end
  local left = st.len
  while cost > 0 and left > 0 do
    local t, n, c = parse_log_entry(redis.call('LINDEX', key, -1))
    if t == nil or t <= cutoff then break end
    if n > cost then
      c = c - cost
      if c < 0 then c = c + LOGM end
      redis.call('LSET', key, -1, log_entry_string(t, n - cost, c))
      cost = 0
    else
      redis.call('RPOP', key)
      cost = cost - n
      left = left - 1
    end
  end
  if left == 0 then
    redis.call('DEL', key)
  end
end

-- Read every request's arguments before touching anything, so that a bad
-- argument refunds nothing.
local n = #KEYS
local reqs = {}
for i = 1, n do
  local base = 4 + 3 * (i - 1)
  local a, tag, w, l, cap, md, tq, tr = policyargs(ARGV[base])
  local alg = algorithm(a)
  local cost = tonumber(ARGV[base + 1])
  local at
  if ARGV[base + 2] ~= '' then
    at = tonumber(ARGV[base + 2]) -- on the clock of now; after now if it stepped back
    if at == nil then
      return redis.error_reply('ERR ratelimit: bad argument for request ' .. i)
    end
  end
  if alg == nil or tr == nil or cost == nil then
    return redis.error_reply('ERR ratelimit: bad argument for request ' .. i)
  end
  reqs[i] = { alg = alg, kind = a, cost = cost, at = at,
    P = { W = w, L = l, cap = cap, maxDelay = md, tauQ = tq, tauR = tr, tag = tag } }
end

local parts = { fmt(now) }
for i = 1, n do
  local r = reqs[i]
  local st = load(KEYS[i], r.alg, r.kind, r.P)
  if mode == 'P' then
    local d = r.alg.decide(st, r.P, r.cost, now)
    if st.old and (st.lost or not d.allowed) and r.cost > 0 then
      -- refused, as the take script refuses it (see load); it writes only
      -- the old record's clamp
      convrefuse(KEYS[i], st, r.P, r.cost, now, d, slack)
    end
    local z = r.alg.decide(st, r.P, 0, now)
    -- A record of this policy left ahead of a clock that stepped back is
    -- written clamped, as every decision writes it (charging nothing), so
    -- that the RetryAfter reported holds for the next decision.
    if z.clamped and not st.rewrite then
      r.alg.saveclamped(KEYS[i], st, r.P, now, z, slack)
    end
    local ok = 0
    if d.allowed then ok = 1 end
    parts[i + 1] = sformat(I64 and '%d %d %d %d %d %d %d %d' or '%d %.0f %.0f %.0f %.0f %.0f %.0f %.0f',
      ok, d.rem, d.reset, d.retry, d.delay, z.rem, z.reset, z.delay)
  elseif st.lost then
    -- a conversion that dropped units is not stored (see load)
  elseif r.at ~= nil and st.converted then
    -- a record another policy wrote since the charge holds none of the
    -- charge's history: nothing is given back (nor the conversion stored)
  else
    refunders[r.kind](r.alg, KEYS[i], st, r.P, r.cost, r.at)
  end
end
return table.concat(parts, ' ')
