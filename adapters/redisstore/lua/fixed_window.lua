-- fixed_window.lua: fixed_window, mirroring core/window.go.
--
-- State: the string "f:A:B;tag", A the index of the epoch-aligned window
-- (floor(now / W)), B the units admitted in it, and the identity tag of
-- the policy that wrote it.
--
-- The functions are made only when a batch uses the algorithm: a script
-- call pays for the closures it needs.

modules.fixed = function()
  local fixed = {}

  function fixed.load(key, v)
    local a, b = getstate(v, '^f:(%-?%d+):(%d+)')
    if a == nil then
      return { A = 0, B = 0 }
    end
    return { A = tonumber(a), B = tonumber(b) }
  end

  function fixed.fresh(P, u, now)
    return { A = floordiv(now, P.W), B = u }
  end

  function fixed.decide(st, P, cost, now)
    local d = newdecision()
    local count = 0
    local idx = floordiv(now, P.W)
    if st.B > 0 then idx = floordiv(settle(now, st.A * P.W), P.W) end
    -- A window in the future (the clock stepped back) counts as the
    -- current one: never credited, refused for at most one window.
    if st.B > 0 and idx <= st.A then
      count = st.B
      d.clamped = idx < st.A
    end
    local e = (idx + 1) * P.W
    if count + cost <= P.cap then
      d.allowed = true
      count = count + cost
      d.nA, d.nB = idx, count
    else
      d.retry = e - now
    end
    -- a count above the capacity (an untagged record of the previous
    -- version, under a lowered Limit) leaves nothing, never less
    d.rem = P.cap - count
    if d.rem < 0 then d.rem = 0 end
    if count > 0 then
      d.reset = e - now
    end
    d.extra = idx
    return d
  end

  -- fixed_store writes window A's count B, with the window's expiry, or
  -- keeping the key's (kept: this policy's record of window A, see
  -- WINDOWTTL).
  local function fixed_store(key, A, B, P, now, slack, kept)
    if B <= 0 then
      redis.call('DEL', key)
      return
    end
    local v = sformat(I64 and 'f:%d:%d;%s' or 'f:%.0f:%.0f;%s', A, B, P.tag)
    if kept then
      keepttl(key, v)
    else
      keep(key, v, (A + 1) * P.W - now, slack)
    end
  end

  function fixed.commit(key, st, P, cost, now, d, slack)
    if cost > 0 then
      fixed_store(key, d.nA, d.nB, P, now, slack, WINDOWTTL and st.own and st.B > 0 and st.A == d.nA)
    elseif st.rewrite then
      fixed.save(key, st, P, now, slack)
    end
    return d.nA
  end

  function fixed.saveclamped(key, st, P, now, d, slack)
    fixed_store(key, d.extra, st.B, P, now, slack)
  end

  function fixed.save(key, st, P, now, slack)
    fixed_store(key, st.A, st.B, P, now, slack)
  end

  -- refund takes cost off the window the charge went to (extra), if that
  -- window is still the stored one; a later window no longer counts it.
  -- Exact.
  function fixed.refund(key, st, P, cost, extra, now, slack)
    if st.B > 0 and st.A == extra then
      local b = st.B - cost
      if b < 0 then b = 0 end
      fixed_store(key, st.A, b, P, now, slack)
    end
  end
  return fixed
end
