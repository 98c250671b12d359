-- gcra.lua: token_bucket and leaky_bucket, mirroring core/gcra.go.
--
-- State: the string "g:A:B", the theoretical arrival time TAT = A + B/L
-- microseconds with 0 <= B < L. A unit costs W/L us of TAT; the bucket
-- admits while TAT' - now <= tau (+ MaxDelay when shaping), tau being the
-- refill time capacity x W / L = tauQ + tauR/L.
--
-- The functions are made only when a batch uses the algorithm: a script
-- call pays for the closures it needs.

modules.gcra = function()
  local gcra = {}

  function gcra.load(key)
    local a, b = getstate(key, '^g:(%-?%d+):(%d+)$')
    if a == nil then
      return { A = 0, B = 0 }
    end
    return { A = tonumber(a), B = tonumber(b) }
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
    -- base = max(TAT, now): a clock behind TAT sees fewer tokens, never more.
    local bq, br = now, 0
    if st.A > now or (st.A == now and st.B > 0) then
      bq, br = st.A, st.B
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

  local function gcra_store(key, A, B, now, slack)
    local exp = A
    if B > 0 then exp = exp + 1 end
    keep(key, sformat(I64 and 'g:%d:%d' or 'g:%.0f:%.0f', A, B), exp - now, slack)
  end

  function gcra.commit(key, st, P, cost, now, d, slack)
    if cost > 0 then
      gcra_store(key, d.nA, d.nB, now, slack)
    end
    return 0
  end

  -- refund takes cost x W/L off the TAT. It is exact when no other request
  -- met a full bucket in between; otherwise it credits at most what refills
  -- between the charge and the refund.
  function gcra.refund(key, st, P, cost, extra, now, slack)
    if st.A == 0 and st.B == 0 then
      return
    end
    local q, r = muldiv(cost, P.W, 0, P.L)
    local A, B = st.A - q, st.B - r
    if B < 0 then
      A, B = A - 1, B + P.L
    end
    gcra_store(key, A, B, now, slack)
  end
  return gcra
end
