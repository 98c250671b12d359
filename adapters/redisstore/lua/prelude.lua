-- prelude.lua: the constants and locals of the ratelimit script, which
-- every call sets up (the exact wide arithmetic, which fast.lua does
-- without, is in arith.lua, and the rest of the helpers in helpers.lua).
--
-- Lua numbers in Redis are IEEE doubles: integers are exact up to 2^53.
-- Every value here is an integer: times and durations in microseconds,
-- counts in units. Values cross the Lua boundary as decimal strings,
-- formatted with fmt (helpers.lua; tostring and '..' would use %.14g and
-- lose digits), except the policy, which comes as MessagePack integers
-- (policyargs), and the take script's reply, an array of integers.

local P53 = 9007199254740992
-- TOL is core.ClockTolerance in microseconds: a decision at most TOL behind
-- the time a key's state was written at decides as at that time, moving
-- nothing back (settle, in helpers.lua; the buckets read such a state as
-- it is, and clamp only one further ahead).
local TOL = 1000000
local floor, fmod, frexp = math.floor, math.fmod, math.frexp
local sformat, smatch, sfind, sbyte = string.format, string.match, string.find, string.byte
