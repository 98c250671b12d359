-- fast.lua: the usual decision, one request taken alone under a token or
-- leaky bucket, without the batch machinery of main.lua, the algorithm
-- modules and the helpers after this file: the arithmetic of gcra.lua
-- (decide, then commit) on plain numbers, with no tables or closures made
-- (helpers.lua and gcra.lua name the steps). Anything else (a batch, a
-- check, a refund, a request over capacity, another algorithm, a bad
-- argument) falls through, untouched, to the rest of the script.

if #KEYS == 1 and ARGV[1] == 'T' and ARGV[3] == '0' then
  -- policyargs, for a token or leaky bucket (our own argument: a value of
  -- another type could only make the arithmetic below fail, not mislead)
  local ok, alg, W, L, cap, md, tauQ, tauR = pcall(cmsgpack.unpack, ARGV[5])
  if ok and alg == 'g' and type(tauR) == 'number' then
    local key, cost, slack = KEYS[1], tonumber(ARGV[6]), tonumber(ARGV[4])
    if redis.replicate_commands then redis.replicate_commands() end
    local now
    if ARGV[2] == '' then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    else
      now = tonumber(ARGV[2])
    end
    -- gcra.load (getstate)
    local A, B = 0, 0
    local v = redis.pcall('GET', key)
    if type(v) == 'string' then
      local a, b = smatch(v, '^g:(%-?%d+):(%d+)$')
      if a ~= nil then
        A, B = tonumber(a), tonumber(b)
      end
    end
    -- gcra.decide, with lesseq and ceildiff written out
    local bq, br = now, 0
    if A > now or (A == now and B > 0) then
      bq, br = A, B
    end
    local q, nr = muldiv(cost, W, br, L)
    local nq = bq + q
    local dq = nq - now
    local lim = tauQ + md
    local allowed, delay, retry = 0, 0, 0
    local rq, rr -- TAT - now of the state reported
    if dq < lim or (dq == lim and nr <= tauR) then
      allowed = 1
      if dq > tauQ or (dq == tauQ and nr > tauR) then
        delay = dq - tauQ
        if nr > tauR then delay = delay + 1 end
      end
      rq, rr = dq, nr
    else
      retry = dq - lim
      if nr > tauR then retry = retry + 1 end
      rq, rr = bq - now, br
    end
    -- gcra_remaining
    local rem = 0
    if rq < tauQ or (rq == tauQ and rr <= tauR) then
      local used, r = muldiv(rq, L, rr, W)
      if r > 0 then used = used + 1 end
      if used < cap then
        rem = cap - used
      end
    end
    local reset = rq
    if rr > 0 then reset = reset + 1 end
    -- gcra.commit (gcra_store, keep)
    if allowed == 1 and cost > 0 then
      local life = nq - now
      if nr > 0 then life = life + 1 end
      if life <= 0 then
        redis.call('DEL', key)
      else
        local ms, r = divmod(life, 1000)
        if r > 0 then ms = ms + 1 end
        redis.call('SET', key, sformat(I64 and 'g:%d:%d' or 'g:%.0f:%.0f', nq, nr), 'PX', fmt(ms + slack))
      end
    end
    return sformat(I64 and '%d %d %d %d %d %d 0' or '%.0f %d %.0f %.0f %.0f %.0f 0', now, allowed, rem, reset, retry, delay)
  end
end
