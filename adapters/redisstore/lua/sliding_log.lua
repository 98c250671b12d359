-- sliding_log.lua: sliding_window_log, mirroring core/slidinglog.go.
--
-- State: a list whose first element is "total;tag", the total of units
-- recorded and the identity tag of the policy that wrote it, and whose
-- other elements are the entries "t:n", one per admission instant t (units
-- admitted at the same instant share an entry), oldest first.
-- Entries are read lazily, CHUNK at a time: a decision reads the expired
-- prefix, the newest entry, and (when refused) the entries up to the one
-- whose expiry admits the request.
--
-- The functions are made only when a batch uses the algorithm: a script
-- call pays for the closures it needs.

modules.swlog = function()
  local swlog = {}
  local CHUNK = 32

  local function parse_entry(s)
    local t, n = smatch(s, '^(%-?%d+):(%d+)$')
    return tonumber(t), tonumber(n)
  end

  local function entry_string(t, n)
    return sformat(I64 and '%d:%d' or '%.0f:%.0f', t, n)
  end

  local function head_string(total, P)
    return fmt(total) .. ';' .. P.tag
  end

  function swlog.fresh(P, u, now)
    if u <= 0 then
      return { len = 0, total = 0, bad = false, t = {}, n = {}, loaded = 0, rewrite = true }
    end
    return { len = 1, total = u, bad = false, t = { now }, n = { u }, loaded = 1,
      newest = now, newestN = u, rewrite = true }
  end

  function swlog.load(key)
    local st = { key = key, len = 0, total = 0, bad = false, t = {}, n = {}, loaded = 0 }
    local head = redis.pcall('LRANGE', key, 0, CHUNK)
    if type(head) ~= 'table' or head.err then
      st.bad = true -- a key of another type: read as fresh, replaced on write
      return st
    end
    if #head == 0 then
      return st
    end
    local total = tonumber(smatch(head[1], '^(%d+)'))
    if total == nil then
      st.bad = true
      return st
    end
    st.total = total
    for i = 2, #head do
      st.t[i - 1], st.n[i - 1] = parse_entry(head[i])
    end
    st.loaded = #head - 1
    if st.loaded < CHUNK then
      st.len = st.loaded
    else
      st.len = redis.call('LLEN', key) - 1
    end
    if st.len > 0 then
      if st.len <= st.loaded then
        st.newest, st.newestN = st.t[st.len], st.n[st.len]
      else
        st.newest, st.newestN = parse_entry(redis.call('LINDEX', key, -1))
      end
    end
    return st
  end

  -- entry returns entry i (1-based, oldest first), loading more if needed.
  local function entry(st, i)
    while i > st.loaded do
      local from = st.loaded + 1
      local more = redis.call('LRANGE', st.key, from, from + CHUNK - 1)
      if #more == 0 then
        return nil, nil
      end
      for j = 1, #more do
        st.t[from + j - 1], st.n[from + j - 1] = parse_entry(more[j])
      end
      st.loaded = st.loaded + #more
    end
    return st.t[i], st.n[i]
  end

  function swlog.decide(st, P, cost, now)
    local d = newdecision()
    -- Units recorded in (now-W, now] count, and so do any recorded after
    -- now by a clock that has since stepped back, as if made at now (the
    -- charge that follows moves them to now): never credited, refused for
    -- at most one Window.
    local k, gone, valid = 0, 0, 0
    if st.len > 0 then
      local cutoff = now - P.W
      while k < st.len do
        local t, n = entry(st, k + 1)
        if t > cutoff then break end
        gone = gone + n
        k = k + 1
      end
      valid = st.total - gone
      d.clamped = st.newest > now
    end
    d.k, d.gone = k, gone
    if valid + cost <= P.cap then
      d.allowed = true
      d.rem = P.cap - valid - cost
      if cost > 0 then
        d.reset = P.W
      elseif valid > 0 then
        local newest = st.newest
        if newest > now then newest = now end
        d.reset = newest + P.W - now
      end
      d.at = now
      d.extra = now
      return d
    end
    -- Refused: wait until enough of the oldest units leave the window.
    local need = valid + cost - P.cap
    for i = k + 1, st.len do
      local t, n = entry(st, i)
      need = need - n
      if need <= 0 then
        if t > now then t = now end
        d.retry = t + P.W - now
        break
      end
    end
    d.rem = P.cap - valid
    if d.rem < 0 then d.rem = 0 end
    local newest = st.newest
    if newest > now then newest = now end
    d.reset = newest + P.W - now
    return d
  end

  -- save writes a state converted from another policy's (at most one
  -- entry) as it is, replacing whatever the key held.
  function swlog.save(key, st, P, now, slack)
    redis.call('DEL', key)
    if st.len > 0 then
      redis.call('RPUSH', key, head_string(st.total, P), entry_string(st.t[1], st.n[1]))
      redis.call('PEXPIRE', key, fmt(ceilms(st.t[1] + P.W - now) + slack))
    end
  end

  -- write charges cost (>= 0) at now: it drops the k expired entries and
  -- moves the entries after now (a clock stepped back) to now, merged with
  -- the charge's entry.
  local function write(key, st, P, cost, now, d, slack)
    local k, at = d.k, now
    local total = st.total - d.gone + cost
    if st.rewrite and st.len > k then
      -- a converted state: its one entry is at now, where the charge goes
      redis.call('DEL', key)
      redis.call('RPUSH', key, head_string(total, P), entry_string(at, st.n[1] + cost))
    elseif st.bad or st.len == 0 or st.rewrite then
      redis.call('DEL', key)
      redis.call('RPUSH', key, head_string(total, P), entry_string(at, cost))
    else
      if k > 0 then
        -- Drop the total and the k expired entries; the total goes back last.
        redis.call('LTRIM', key, k + 1, -1)
      end
      local units = cost
      local live = st.len - k
      if live > 0 and st.newest >= at then
        local t, n = st.newest, st.newestN
        while live > 0 and t >= at do
          units = units + n
          redis.call('RPOP', key)
          live = live - 1
          if live == 0 then break end
          t, n = parse_entry(redis.call('LINDEX', key, -1))
        end
      end
      redis.call('RPUSH', key, entry_string(at, units))
      if k > 0 then
        redis.call('LPUSH', key, head_string(total, P))
      else
        redis.call('LSET', key, 0, head_string(total, P))
      end
    end
    redis.call('PEXPIRE', key, fmt(ceilms(at + P.W - now) + slack))
    return at
  end

  function swlog.commit(key, st, P, cost, now, d, slack)
    if cost <= 0 then
      if st.rewrite then swlog.save(key, st, P, now, slack) end
      return now
    end
    return write(key, st, P, cost, now, d, slack)
  end

  -- saveclamped moves the entries after now to now (a clock stepped back),
  -- so that they leave the window one Window from now.
  function swlog.saveclamped(key, st, P, now, d, slack)
    write(key, st, P, 0, now, d, slack)
  end

  -- refund takes cost off the entry recorded at the charge's instant (extra),
  -- if it is still in the log; an entry that has left the window no longer
  -- counts. Exact.
  function swlog.refund(key, st, P, cost, extra, now, slack)
    if st.bad or st.len == 0 or extra > st.newest then
      return
    end
    -- Entries are ordered by time: search backwards from the newest.
    local hi = st.len
    while hi >= 1 do
      local lo = hi - CHUNK + 1
      if lo < 1 then lo = 1 end
      local part = redis.call('LRANGE', key, lo, hi)
      for j = #part, 1, -1 do
        local t, n = parse_entry(part[j])
        if t == extra then
          local idx = lo + j - 1
          local take = cost
          if take > n then take = n end
          if n > take then
            redis.call('LSET', key, idx, entry_string(t, n - take))
          else
            redis.call('LSET', key, idx, '-')
            redis.call('LREM', key, -1, '-')
          end
          local total = st.total - take
          if st.len == 1 and n == take then
            redis.call('DEL', key)
          else
            redis.call('LSET', key, 0, head_string(total, P))
          end
          return
        end
        if t < extra then
          return
        end
      end
      hi = lo - 1
    end
  end
  return swlog
end
