-- sliding_log.lua: sliding_window_log, mirroring core/slidinglog.go.
--
-- State: a list whose first element is "base;tag" and whose other elements
-- are the entries "t:n:c", one per admission instant t (units admitted at
-- the same instant share an entry), oldest first: n units admitted at t,
-- and c the running count of units recorded (modulo M = 2^52) up to and
-- including this entry; base is the running count before the first entry
-- kept. The units of entries i+1..j are c_j - c_i (mod M), which is exact
-- since fewer than M units are ever in a window (capacity <= 2^50).
--
-- Every decision does work bounded by log2 of the log's length, not by
-- the length: binary searches over the entries (LINDEX) find the first
-- entry inside the window and, when refused, the entry whose expiry admits
-- the request; a charge drops the expired prefix with one LTRIM. Only
-- entries recorded after now (a clock stepped back), which a charge moves
-- to now, and a refund (Cluster batches spanning slots) touch the entries
-- after one. A list without a tag (its first element the total; entries
-- "t:n"), which this store never writes, is read as all its units recorded at its
-- newest entry's instant (never a credit; at most one Window of
-- over-counting) and rewritten in this form at the next charge.
--
-- The functions are made only when a batch uses the algorithm: a script
-- call pays for the closures it needs.

modules.swlog = function()
  local swlog = {}
  local M = 4503599627370496 -- 2^52
  local TRIM = 1024 -- expired entries dropped per charge at most

  local function cdiff(a, b)
    local d = a - b
    if d < 0 then d = d + M end
    return d
  end

  local function parse_entry(s)
    local t, n, c = smatch(s, '^(%-?%d+):(%d+):(%d+)$')
    return tonumber(t), tonumber(n), tonumber(c)
  end

  local function entry_string(t, n, c)
    return sformat(I64 and '%d:%d:%d' or '%.0f:%.0f:%.0f', t, n, c)
  end

  local function head_string(base, P)
    return fmt(base) .. ';' .. P.tag
  end

  -- fresh returns a state of u units recorded at now, which commit writes
  -- whole (a state converted from another policy's).
  function swlog.fresh(P, u, now)
    if u <= 0 then
      return { len = 0, base = 0, virt = true, t = {}, n = {}, c = {}, rewrite = true }
    end
    return { len = 1, base = 0, virt = true, t = { now }, n = { u }, c = { u },
      newest = now, newestN = u, newestC = u, rewrite = true }
  end

  function swlog.load(key)
    local head = typed(redis.pcall('LINDEX', key, 0))
    if type(head) == 'table' and head.err then
      -- a key of another type: read as fresh, replaced on write
      local st = swlog.fresh(nil, 0, 0)
      st.bad = true
      return st
    end
    if type(head) ~= 'string' then
      -- a new key: written whole by the first charge
      return { len = 0, base = 0, virt = true, missing = true, t = {}, n = {}, c = {} }
    end
    local len = redis.call('LLEN', key) - 1
    local base = smatch(head, '^(%d+);')
    if base ~= nil then
      local st = { key = key, len = len, base = tonumber(base), cache = {} }
      if len > 0 then
        st.newest, st.newestN, st.newestC = parse_entry(redis.call('LINDEX', key, -1))
        if st.newest == nil then
          st = swlog.fresh(nil, 0, 0)
          st.bad = true
        end
      end
      return st
    end
    -- A list without a tag: all its units at its newest instant.
    local total = tonumber(smatch(head, '^(%d+)$'))
    local newest
    if len > 0 then
      newest = tonumber(smatch(redis.call('LINDEX', key, -1), '^(%-?%d+):'))
    end
    if total == nil or total <= 0 or newest == nil then
      local st = swlog.fresh(nil, 0, 0)
      st.bad = true
      return st
    end
    local st = swlog.fresh(nil, total, newest)
    st.bad = true
    return st
  end

  -- FOREIGN is raised by entry for an entry this store did not write (load
  -- reads only the head and the newest entry): the calls made through
  -- guarded then take the key as one of a foreign shape.
  local FOREIGN = {}

  -- entry returns entry i (1-based, oldest first): its instant, units and
  -- running count.
  local function entry(st, i)
    if st.virt then
      return st.t[i], st.n[i], st.c[i]
    end
    local e = st.cache[i]
    if e == nil then
      e = { parse_entry(redis.call('LINDEX', st.key, i)) }
      if e[1] == nil then error(FOREIGN) end
      st.cache[i] = e
    end
    return e[1], e[2], e[3]
  end

  -- guarded returns f, which reads entries before it writes anything, made
  -- to read a key with an entry of a foreign shape as load reads any key of
  -- a foreign type or shape: fresh (st becomes that state), to be replaced
  -- whole by the next write.
  local function guarded(f)
    return function(key, st, ...)
      local ok, r = pcall(f, key, st, ...)
      if ok then return r end
      if r ~= FOREIGN then error(r, 0) end
      for k in pairs(st) do st[k] = nil end
      for k, v in pairs(swlog.fresh(nil, 0, 0)) do st[k] = v end
      st.bad = true
      return f(key, st, ...)
    end
  end

  -- expired returns the number k of entries at or before cutoff (a prefix,
  -- entries being ordered by time) and the running count after them.
  local function expired(st, cutoff)
    local lo, hi = 0, st.len
    while lo < hi do
      local mid = floor((lo + hi + 1) / 2)
      local t = entry(st, mid)
      if t <= cutoff then lo = mid else hi = mid - 1 end
    end
    if lo == 0 then
      return 0, st.base
    end
    local _, _, c = entry(st, lo)
    return lo, c
  end

  local decide
  function swlog.decide(st, P, cost, now) return decide(nil, st, P, cost, now) end
  decide = guarded(function(_, st, P, cost, now)
    local d = newdecision()
    -- Units recorded in (now-W, now] count, and so do any recorded after
    -- now by more than TOL, by a clock that has since stepped back, as if
    -- made at now (the charge that follows moves them to now): never
    -- credited, refused for at most one Window. Units recorded at most
    -- TOL after now are a later decision's: decided at dnow, the newest's
    -- time (settle), the charge recorded then. Durations count from now.
    local k, ck, valid, dnow = 0, st.base, 0, now
    if st.len > 0 then
      dnow = settle(now, st.newest)
      k, ck = expired(st, dnow - P.W)
      valid = cdiff(st.newestC, ck)
      d.clamped = st.newest > dnow
    end
    d.k, d.ck = k, ck
    if valid + cost <= P.cap then
      d.allowed = true
      d.rem = P.cap - valid - cost
      if cost > 0 then
        d.reset = dnow + P.W - now
      elseif valid > 0 then
        local newest = st.newest
        if newest > dnow then newest = dnow end
        d.reset = newest + P.W - now
      end
      d.at = dnow
      d.extra = dnow
      return d
    end
    -- Refused: wait until enough of the oldest units leave the window: the
    -- first entry i whose running count reaches need past ck.
    local need = valid + cost - P.cap
    if need <= valid then
      local lo, hi = k + 1, st.len
      while lo < hi do
        local mid = floor((lo + hi) / 2)
        local _, _, c = entry(st, mid)
        if cdiff(c, ck) >= need then hi = mid else lo = mid + 1 end
      end
      local t = entry(st, lo)
      if t > dnow then t = dnow end
      d.retry = t + P.W - now
    end
    d.rem = P.cap - valid
    if d.rem < 0 then d.rem = 0 end
    local newest = st.newest
    if newest > dnow then newest = dnow end
    d.reset = newest + P.W - now
    return d
  end)

  -- write charges cost (>= 0) at now: it drops the k expired entries and
  -- moves the entries after now (a clock stepped back) to now, merged with
  -- the charge's entry.
  local write
  write = guarded(function(key, st, P, cost, now, d, slack)
    local ttl = ceilms(P.W) + slack
    if d.at ~= nil and d.at > now then
      -- decided at the newest entry's time (settle): the charge is recorded
      -- then, and the key lives a Window from it
      ttl = ceilms(P.W + d.at - now) + slack
      now = d.at
    end
    local k, ck = d.k, d.ck
    local last = st.base
    if st.len > 0 then last = st.newestC end
    local newC = last + cost
    if newC >= M then newC = newC - M end
    if st.virt or st.bad then
      -- rewrite whole: the (at most one) live entry, then the charge's
      local live = st.len - k
      local parts = { head_string(0, P) }
      if live > 0 then
        local t, n = st.t[1], st.n[1]
        if t >= now then
          parts[2] = entry_string(now, n + cost, n + cost)
        else
          parts[2] = entry_string(t, n, n)
          if cost > 0 then parts[3] = entry_string(now, cost, n + cost) end
        end
      elseif cost > 0 then
        parts[2] = entry_string(now, cost, cost)
      end
      if #parts == 1 then
        if not st.missing then redis.call('DEL', key) end
        return now
      end
      if not st.missing then
        -- what the key holds (another policy's record, another type) is
        -- replaced, SET first: out of memory (maxmemory, noeviction),
        -- Redis refuses a script's first write only if it may grow
        -- memory, as SET and RPUSH may and DEL may not, and lets every
        -- write after it through
        redis.call('SET', key, '')
        redis.call('DEL', key)
      end
      redis.call('RPUSH', key, unpack(parts))
    else
      -- The charge's entry, merged with the newest entries at or after now
      -- (a clock stepped back, or charges at now), goes in first; then the
      -- head and at most TRIM of the k expired entries are dropped (the
      -- rest go with later charges; they never count, being before the
      -- window), the head, with the running count before the first entry
      -- kept, taking the place of the last one dropped. So the first write
      -- is one that may grow memory (LSET, RPUSH): out of memory
      -- (maxmemory, noeviction), Redis refuses a script's first write only
      -- if so, and lets every write after it through, a batch's other
      -- requests' too.
      local base = st.base
      if k > TRIM then
        k = TRIM
        local _, _, c = entry(st, k)
        base = c
      elseif k > 0 then
        base = ck
      end
      local units = cost
      local live = st.len - k
      local m = 0 -- the newest entries merged into the charge's
      if live > 0 and st.newest >= now then
        units, m = units + st.newestN, 1
        while m < live do
          local t, n = entry(st, st.len - m)
          if t < now then break end
          units, m = units + n, m + 1
        end
      end
      if m > 0 then
        local i = st.len - m + 1 -- the oldest merged entry's index (the head's is 0)
        redis.call('LSET', key, i, entry_string(now, units, newC))
        if m > 1 then
          redis.call('LTRIM', key, 0, i)
        end
      elseif units > 0 then
        redis.call('RPUSH', key, entry_string(now, units, newC))
      end
      if k > 0 then
        redis.call('LSET', key, k, head_string(base, P))
        redis.call('LTRIM', key, k, -1)
      end
    end
    redis.call('PEXPIRE', key, fmt(ttl))
    return now
  end)

  -- save writes a state converted from another policy's as it is,
  -- replacing whatever the key held.
  function swlog.save(key, st, P, now, slack)
    if st.len == 0 then
      redis.call('DEL', key)
      return
    end
    -- a converted state's entry at most TOL after now stays at its time
    write(key, st, P, 0, now, { k = 0, ck = 0, at = settle(now, st.newest) }, slack)
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

  -- refund takes cost off the entry recorded at the charge's instant
  -- (extra), if it is still in the log, and off the running counts after
  -- it; an entry that has left the window no longer counts. Exact. It
  -- reads the entries from the newest back to that one (a refund follows
  -- its charge within the store's Timeout, so they are few).
  swlog.refund = guarded(function(key, st, P, cost, extra, now, slack)
    if st.virt or st.bad or st.len == 0 or extra > st.newest then
      return
    end
    local i = st.len
    while i >= 1 do
      local t = entry(st, i)
      if t == extra then break end
      if t < extra then return end
      i = i - 1
    end
    if i < 1 then return end
    local _, n = entry(st, i)
    local take = cost
    if take > n then take = n end
    for j = st.len, i, -1 do
      local t, nj, c = entry(st, j)
      c = c - take
      if c < 0 then c = c + M end
      if j == i then nj = nj - take end
      if nj > 0 then
        redis.call('LSET', key, j, entry_string(t, nj, c))
      else
        redis.call('LSET', key, j, '-')
        redis.call('LREM', key, -1, '-')
      end
    end
    if redis.call('LLEN', key) <= 1 then
      redis.call('DEL', key)
    end
  end)
  return swlog
end
