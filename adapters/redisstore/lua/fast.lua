-- fast.lua: the usual decision, one request taken alone under a token
-- bucket, a leaky bucket or a fixed window, without the batch machinery of
-- main.lua, the algorithm modules and the helpers after this file: the
-- arithmetic of gcra.lua and fixed_window.lua (decide, then commit) on
-- plain numbers, with no closures made and one table, the reply
-- (helpers.lua, gcra.lua and fixed_window.lua name the steps). Anything
-- else (a check, a refund, another algorithm, a record written under
-- another policy, a bad argument, a bucket whose arithmetic reaches 2^53
-- without a whole emission interval) falls through, untouched, to the rest of the script (shortargs.lua
-- first).
--
-- The usual decision comes with the short arguments (one key, at most
-- four arguments): ARGV[1] the policy (as main.lua's), ARGV[2] the cost,
-- and, in client-time mode, ARGV[3] now and ARGV[4] the expiry slack
-- (without them: the server's TIME and 1 ms). The store sends a single
-- take this way, and every other call with main.lua's arguments, which
-- this file leaves to the rest of the script: fewer arguments are less
-- for the server to read and to hand to the script on every call.
--
-- Every call of the script runs it from the top: what is set up before
-- this point is paid by every decision, so only the locals of prelude.lua
-- are (a closure costs the server about as much as a command's reply:
-- muldiv and divmod are made after this file, in arith.lua, and the
-- divisions here are written out). The check of I64 (helpers.lua)
-- is made only for a value that needs it (one beyond 2^31 in magnitude,
-- where a 32-bit C long would not hold it).

if #KEYS == 1 and #ARGV <= 4 then
  -- policyargs, for a token or leaky bucket or a fixed window (our own
  -- argument: a value of another type could only make the arithmetic
  -- below fail, not mislead)
  local ok, alg, tag, W, L, cap, md, tauQ, tauR = pcall(cmsgpack.unpack, ARGV[1])
  local key = KEYS[1]
  -- load: a missing key, or a record of this policy (or of the previous
  -- version, untagged) in the algorithm's shape
  local A, B, fresh, mine, tagged = 0, 0, true, false, false
  if ok and (alg == 'g' or alg == 'f') and type(tag) == 'string' and type(tauR) == 'number' then
    local v = redis.pcall('GET', key)
    if v == false then
      mine = true
    elseif type(v) == 'string' then
      -- the record's numbers, then nothing (untagged) or ';' and this
      -- policy's tag, compared in place
      local _, e, a, b = sfind(v, alg == 'g' and '^g:(%-?%d+):(%d+)' or '^f:(%-?%d+):(%d+)')
      if a ~= nil then
        local n = #v
        if e == n then
          A, B, fresh, mine = tonumber(a), tonumber(b), false, true
        elseif n - e == #tag + 1 and sbyte(v, e + 1) == 59 and sfind(v, tag, e + 2, true) then
          A, B, fresh, mine, tagged = tonumber(a), tonumber(b), false, true, true
        end
      end
    end
  end
  if mine then
    -- the usual cost and slack, 1, without converting them
    local cost, nowArg, slack = ARGV[2], ARGV[3], ARGV[4]
    if cost == '1' then cost = 1 else cost = tonumber(cost) end
    if slack == nil or slack == '1' then slack = 1 else slack = tonumber(slack) end
    local now
    if nowArg == nil then
      -- before Redis 7 (which has REDIS_VERSION_NUM), effects replication
      -- may need asking for before TIME
      if redis.REDIS_VERSION_NUM == nil and redis.replicate_commands then redis.replicate_commands() end
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    else
      now = tonumber(nowArg)
    end
    if alg == 'f' then
      -- fixed.decide: the window's index is floor(now / W), or the
      -- record's when it starts at most TOL after now (settle); a window
      -- further in the future (the clock stepped back) counts as the
      -- current one
      local r = fmod(now, W)
      if r < 0 then r = r + W end
      local idx = (now - r) / W
      if B > 0 and idx < A and A * W - now <= TOL then idx = A end
      local count, clamped = 0, false
      if B > 0 and idx <= A then
        count, clamped = B, idx < A
      end
      local e = (idx + 1) * W - now
      local allowed, retry, nB = 0, 0, 0
      if count + cost <= cap then
        allowed, count = 1, count + cost
        if cost > 0 then nB = count end
      else
        retry = e
        -- fixed.saveclamped: the stepped-back window's count, moved to
        -- the current one, so the bound holds
        if clamped then nB = B end
      end
      -- fixed.commit / fixed_store (with keep, or keepttl for this
      -- policy's record of this window on the server's clock): e > 0
      -- always
      if nB > 0 then
        local kept = tagged and idx == A and nowArg == nil and redis.REDIS_VERSION_NUM
        local ms = 0
        if not kept then
          local rm = fmod(e, 1000)
          ms = (e - rm) / 1000
          if rm > 0 then ms = ms + 1 end
          ms = ms + slack
        end
        local fv, fx = 'f:%d:%d;%s', '%d'
        if (idx >= 2147483648 or idx < -2147483648 or nB >= 2147483648 or ms >= 2147483648)
            and sformat('%d', P53) ~= '9007199254740992' then
          fv, fx = 'f:%.0f:%.0f;%s', '%.0f'
        end
        if kept then
          redis.call('SET', key, sformat(fv, idx, nB, tag), 'KEEPTTL')
        else
          redis.call('SET', key, sformat(fv, idx, nB, tag), 'PX', sformat(fx, ms))
        end
      end
      local reset, rem = 0, cap - count
      if count > 0 then reset = e end
      if rem < 0 then rem = 0 end -- as fixed.decide: never below 0
      return { now, allowed, rem, reset, retry, 0, idx }
    end
    -- gcra.decide, with lesseq and ceildiff written out, and muldiv's
    -- products as single divisions while they stay below 2^53, exact.
    -- Past 2^53, a whole emission interval T = W/L (a million a day: 86.4
    -- ms) divides exactly without the product; any other quota whose
    -- product reaches 2^53 (the arithmetic then needs muldiv's wide path,
    -- arith.lua) falls through, before anything is written, to the rest
    -- of the script.
    local bq, br, clamped = now, 0, false
    if not fresh and (A > now or (A == now and B > 0)) then
      bq, br = A, B
      local mq = now + tauQ + md
      local mt = mq + TOL
      if bq > mt or (bq == mt and br > tauR) then
        bq, br = mq, tauR
        clamped = true
      end
    end
    local p, q, nr = cost * W + br, nil, nil
    if p < P53 then
      nr = fmod(p, L)
      q = (p - nr) / L
    elseif fmod(W, L) == 0 then
      -- (cost*W + br) / L = cost*T + br/L, and br < L
      q, nr = cost * (W / L), br
    end
    if q ~= nil then
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
      local rem, wide = 0, false
      if rq < tauQ or (rq == tauQ and rr <= tauR) then
        local u = rq * L + rr
        if u < P53 then
          local r = fmod(u, W)
          local used = (u - r) / W
          if r > 0 then used = used + 1 end
          if used < cap then
            rem = cap - used
          end
        elseif fmod(W, L) == 0 then
          -- (rq*L + rr) / W = rq/T + rr/W: with rq = m*T + s and rr < L,
          -- the quotient is m, and the remainder s*L + rr is 0 only when
          -- s and rr are
          local T = W / L
          local s = fmod(rq, T)
          local used = (rq - s) / T
          if s > 0 or rr > 0 then used = used + 1 end
          if used < cap then
            rem = cap - used
          end
        else
          wide = true
        end
      end
      if not wide then
        local reset = rq
        if rr > 0 then reset = reset + 1 end
        -- gcra.commit (gcra_store, keep)
        if clamped and (allowed == 0 or cost == 0) then
          -- a clock stepped back: keep the clamped TAT, so the bound holds
          nq, nr = bq, br
        end
        if (allowed == 1 and cost > 0) or clamped then
          local life = nq - now
          if nr > 0 then life = life + 1 end
          if life <= 0 then
            redis.call('DEL', key)
          else
            local r = fmod(life, 1000)
            local ms = (life - r) / 1000
            if r > 0 then ms = ms + 1 end
            ms = ms + slack
            local gv, gx = 'g:%d:%d;%s', '%d'
            if (nq >= 2147483648 or nq < -2147483648 or nr >= 2147483648 or ms >= 2147483648)
                and sformat('%d', P53) ~= '9007199254740992' then
              gv, gx = 'g:%.0f:%.0f;%s', '%.0f'
            end
            redis.call('SET', key, sformat(gv, nq, nr, tag), 'PX', sformat(gx, ms))
          end
        end
        return { now, allowed, rem, reset, retry, delay, 0 }
      end
    end
  end
end
