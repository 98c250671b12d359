-- shortargs.lua: the short arguments of a single take (see fast.lua), when
-- fast.lua has not decided it, rewritten in main.lua's form: mode 'T',
-- now ('' for the server's TIME), no request over capacity, the slack
-- (1 ms unless given), then the policy, the cost and 0.

if #KEYS == 1 and #ARGV <= 4 then
  local P, cost, now, slack = ARGV[1], ARGV[2], ARGV[3] or '', ARGV[4] or '1'
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7] = 'T', now, '0', slack, P, cost, '0'
end
