-- gcra.lua: token_bucket and leaky_bucket, mirroring core/gcra.go.
--
-- State: the string "g:A:B;tag", the theoretical arrival time TAT = A + B/L
-- microseconds with 0 <= B < L, and the identity tag of the policy that
-- wrote it. A unit costs W/L us of TAT; the bucket admits while
-- TAT' - now <= tau (+ MaxDelay when shaping), tau being the refill time
-- capacity x W / L = tauQ + tauR/L.
--
-- The functions are made only when a batch uses the algorithm: a script
-- call pays for the closures it needs.

modules.gcra = function()
  local gcra = {}

  -- load reads the state from v, the key's GET reply.
  function gcra.load(key, v)
    local a, b = getstate(v, '^g:(%-?%d+):(%d+)')
    if a == nil then
      return { A = 0, B = 0, fresh = true }
    end
    return { A = tonumber(a), B = tonumber(b) }
  end

  -- fresh returns a fresh state charged u units at now.
  function gcra.fresh(P, u, now)
    if u <= 0 then
      return { A = 0, B = 0, fresh = true }
    end
    local q, r = muldiv(u, P.W, 0, P.L)
    return { A = now + q, B = r }
  end

  -- remaining returns the whole tokens left when TAT - now = dq + dr/L.
  local function gcra_remaining(P, dq, dr)
    if not lesseq(dq, dr, P.tauQ, P.tauR) then
      return 0
    end
    local q, r = muldiv(dq, P.L, dr, P.W)
    local used = q
    if r > 0 then used = used + 1 end
    if used >= P.cap then
      return 0
    end
    return P.cap - used
  end

  function gcra.decide(st, P, cost, now)
    local d = newdecision()
    -- base = max(TAT, now): a clock behind TAT sees fewer tokens, never
    -- more. A TAT beyond now + tau + MaxDelay, where no admitted state can
    -- be, comes from a later decision: by at most TOL, read as it is;
    -- further (the clock stepped back), read as now + tau + MaxDelay, so
    -- that it refuses for at most the refill time.
    local bq, br = now, 0
    if not st.fresh and (st.A > now or (st.A == now and st.B > 0)) then
      bq, br = st.A, st.B
      local mq = now + P.tauQ + P.maxDelay
      if not lesseq(bq, br, mq + TOL, P.tauR) then
        bq, br = mq, P.tauR
        d.clamped, d.cA, d.cB = true, bq, br
      end
    end
    local q, nr = muldiv(cost, P.W, br, P.L)
    local nq = bq + q
    local dq = nq - now
    local lim = P.tauQ + P.maxDelay
    if lesseq(dq, nr, lim, P.tauR) then
      d.allowed = true
      if not lesseq(dq, nr, P.tauQ, P.tauR) then
        d.delay = ceildiff(dq, nr, P.tauQ, P.tauR)
      end
      d.rem = gcra_remaining(P, dq, nr)
      d.reset = ceildiff(dq, nr, 0, 0)
      d.nA, d.nB = nq, nr
      return d
    end
    d.retry = ceildiff(dq, nr, lim, P.tauR)
    d.rem = gcra_remaining(P, bq - now, br)
    d.reset = ceildiff(bq - now, br, 0, 0)
    return d
  end

  local function gcra_store(key, A, B, P, now, slack)
    local exp = A
    if B > 0 then exp = exp + 1 end
    keep(key, sformat(I64 and 'g:%d:%d;%s' or 'g:%.0f:%.0f;%s', A, B, P.tag), exp - now, slack)
  end

  function gcra.commit(key, st, P, cost, now, d, slack)
    if cost > 0 then
      gcra_store(key, d.nA, d.nB, P, now, slack)
    elseif st.rewrite then
      gcra.save(key, st, P, now, slack)
    end
    return 0
  end

  -- saveclamped writes the state as decide clamped it (a clock stepped
  -- back), so that the clamp's bound holds from now on.
  function gcra.saveclamped(key, st, P, now, d, slack)
    gcra_store(key, d.cA, d.cB, P, now, slack)
  end

  -- save writes st as it is (a state converted from another policy's).
  function gcra.save(key, st, P, now, slack)
    if st.fresh then
      redis.call('DEL', key)
      return
    end
    gcra_store(key, st.A, st.B, P, now, slack)
  end

  -- refund takes cost x W/L off the TAT. It is exact when no other request
  -- met a full bucket in between; otherwise it credits at most what refills
  -- between the charge and the refund.
  function gcra.refund(key, st, P, cost, extra, now, slack)
    if st.fresh then
      return
    end
    local q, r = muldiv(cost, P.W, 0, P.L)
    local A, B = st.A - q, st.B - r
    if B < 0 then
      A, B = A - 1, B + P.L
    end
    gcra_store(key, A, B, P, now, slack)
  end
  return gcra
end
