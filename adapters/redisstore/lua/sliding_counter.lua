-- sliding_counter.lua: sliding_window_counter, mirroring core/window.go.
--
-- State: the string "c:A:P:C;tag", A the current window index, P the
-- previous window's count, C the current window's count, and the identity
-- tag of the policy that wrote it.
--
-- The functions are made only when a batch uses the algorithm: a script
-- call pays for the closures it needs.

modules.counter = function()
  local counter = {}

  function counter.load(key, v)
    local a, p, c = getstate(v, '^c:(%-?%d+):(%d+):(%d+)')
    if a == nil then
      return { A = 0, prev = 0, curr = 0 }
    end
    return { A = tonumber(a), prev = tonumber(p), curr = tonumber(c) }
  end

  function counter.fresh(P, u, now)
    return { A = floordiv(now, P.W), prev = 0, curr = u }
  end

  -- counts returns the window index and the previous and current counts as
  -- of now. A stored window in the future (the clock stepped back) counts
  -- as the current one: never credited, refused for at most two windows.
  local function swc_counts(st, P, now)
    local idx = floordiv(now, P.W)
    if st.prev == 0 and st.curr == 0 then
      return idx, 0, 0
    end
    if idx == st.A then
      return idx, st.prev, st.curr
    elseif idx < st.A then
      -- a window in the future (the clock stepped back): all of its units
      -- count as the current window's, as core's swcCounts reads them
      local c = st.prev + st.curr
      if c > P.cap then c = P.cap end
      return idx, 0, c
    elseif idx == st.A + 1 then
      return idx, st.curr, 0
    end
    return idx, 0, 0
  end

  -- weighted returns ceil(prev x (w - e) / w).
  local function swc_weighted(prev, e, w)
    if prev == 0 then
      return 0
    end
    if e < 0 then e = 0 end
    local q, r = muldiv(prev, w - e, 0, w)
    if r > 0 then
      return q + 1
    end
    return q
  end

  -- earliest returns the earliest elapsed time e in [0, w) at which
  -- prev x (w-e) <= room x w holds, or w when none does.
  local function swc_earliest(prev, room, w)
    if room < 0 then
      return w
    end
    if prev == 0 then
      return 0
    end
    local q = muldiv(room, w, 0, prev)
    if q >= w then
      return 0
    end
    return w - q
  end

  function counter.decide(st, P, cost, now)
    local d = newdecision()
    local w = P.W
    -- dnow: the time to decide at (settle); durations count from now
    local dnow = now
    if st.prev > 0 or st.curr > 0 then dnow = settle(now, st.A * w) end
    local idx, prev, curr = swc_counts(st, P, dnow)
    d.clamped = (prev > 0 or curr > 0) and idx < st.A
    local start = idx * w
    local e = dnow - start
    local used = swc_weighted(prev, e, w) + curr
    if used + cost <= P.cap then
      d.allowed = true
      curr = curr + cost
      used = used + cost
      d.nA, d.nP, d.nC = idx, prev, curr
    else
      local at
      local e2 = swc_earliest(prev, P.cap - curr - cost, w)
      if e2 < w then
        at = start + e2
      else
        local e3 = swc_earliest(curr, P.cap - cost, w)
        if e3 < w then
          at = start + w + e3 -- the next window, where curr becomes prev
        else
          at = start + 2 * w
        end
      end
      if at <= dnow then
        at = dnow + 1
      end
      d.retry = at - now
    end
    d.rem = P.cap - used
    if d.rem < 0 then d.rem = 0 end
    if curr > 0 then
      d.reset = start + 2 * w - now
    elseif prev > 0 then
      d.reset = start + w - now
    end
    d.extra = idx
    return d
  end

  local function counter_store(key, A, prev, curr, P, now, slack)
    local exp
    if curr > 0 then
      exp = (A + 2) * P.W
    elseif prev > 0 then
      exp = (A + 1) * P.W
    else
      redis.call('DEL', key)
      return
    end
    keep(key, sformat(I64 and 'c:%d:%d:%d;%s' or 'c:%.0f:%.0f:%.0f;%s', A, prev, curr, P.tag), exp - now, slack)
  end

  function counter.commit(key, st, P, cost, now, d, slack)
    if cost > 0 then
      counter_store(key, d.nA, d.nP, d.nC, P, now, slack)
    elseif st.rewrite then
      counter.save(key, st, P, now, slack)
    end
    return d.nA
  end

  -- saveclamped moves a window in the future (the clock stepped back) to
  -- now's, all of its units in its count, as decide read them.
  function counter.saveclamped(key, st, P, now, d, slack)
    local c = st.prev + st.curr
    if c > P.cap then c = P.cap end
    counter_store(key, d.extra, 0, c, P, now, slack)
  end

  function counter.save(key, st, P, now, slack)
    counter_store(key, st.A, st.prev, st.curr, P, now, slack)
  end

  -- refund takes cost off the count of the window the charge went to
  -- (extra): the current count while that window is current, the previous
  -- count once the next window has begun. Exact.
  function counter.refund(key, st, P, cost, extra, now, slack)
    local prev, curr = st.prev, st.curr
    if st.A == extra then
      curr = curr - cost
      if curr < 0 then curr = 0 end
    elseif st.A == extra + 1 then
      prev = prev - cost
      if prev < 0 then prev = 0 end
    else
      return
    end
    if prev == st.prev and curr == st.curr then
      return
    end
    counter_store(key, st.A, prev, curr, P, now, slack)
  end
  return counter
end
