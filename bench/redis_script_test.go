package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// scriptOp is one step a rate-limiting script can take, run in a loop
// inside one script so that its cost on the server is measured without the
// call of the script, the round trip or the client.
type scriptOp struct {
	name string
	body string // Lua, run once per iteration; x is a local to assign to
	// setup, if set, is Lua run once before the loop (locals the body
	// uses).
	setup func(tb testing.TB) string
}

// scriptOps are the steps of the fixed-window scripts compared in
// BenchmarkRedisHotKeyParallel64 and BenchmarkRedisKeys100kParallel64:
// ulule's (INCRBY, then PTTL) and ours (unpack the policy, GET the tagged
// record, match it, read the server clock, format the record, SET it: with
// its expiry for a window's first charge, keeping it for the later ones),
// the two sequences of commands whole (ours as for a later charge), and
// the two scripts whole, their Lua around the commands included: ulule's
// as it counts a request after a window's first, ours as its fast path
// decides a charge after a window's first. "loop" is the loop alone, to be
// subtracted from the others.
var scriptOps = []scriptOp{
	{name: "loop", body: `x = i`},
	{name: "TIME", body: `x = redis.call('TIME')`},
	{name: "GET", body: `x = redis.call('GET', KEYS[1])`},
	{name: "SET-PX", body: `x = redis.call('SET', KEYS[1], 'f:29527333:17;f,1000000000,1000000,1000000000', 'PX', '60250')`},
	{name: "SET-KEEPTTL", body: `x = redis.call('SET', KEYS[1], 'f:29527333:17;f,1000000000,1000000,1000000000', 'KEEPTTL')`},
	{name: "INCRBY", body: `x = redis.call('INCRBY', KEYS[2], '1')`},
	{name: "PTTL", body: `x = redis.call('PTTL', KEYS[2])`},
	{name: "unpack-policy", body: `local ok, a, b, c, d, e, f, g, h = pcall(cmsgpack.unpack, P) x = h`},
	{name: "match-record", body: `local a, b, r = string.match(V, '^f:(%-?%d+):(%d+)(.*)$') x = r`},
	{name: "format-record", body: `x = string.format('f:%d:%d;%s', 29527333, 17, 'f,1000000000,1000000,1000000000')`},
	{name: "INCRBY+PTTL", body: `x = redis.call('INCRBY', KEYS[2], '1') x = redis.call('PTTL', KEYS[2])`},
	{name: "TIME+GET+SET-KEEPTTL", body: `x = redis.call('TIME') x = redis.call('GET', KEYS[1]) x = redis.call('SET', KEYS[1], 'f:29527333:17;f,1000000000,1000000,1000000000', 'KEEPTTL')`},
	{name: "ulule-script", setup: ululeScript, body: `x = ulule({KEYS[2]}, {'1', '600000'})`},
	{name: "fast-path", setup: ourFastPath, body: `x = fast(FK, FA)`},
}

// ululeScript defines ulule(KEYS, ARGV), the body of ulule/limiter's
// Redis store script that counts a request, as of v3.11.2.
func ululeScript(testing.TB) string {
	return `local function ulule(KEYS, ARGV)
local key = KEYS[1]
local count = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local ret = redis.call("incrby", key, ARGV[1])
if ret == count then
	if ttl > 0 then
		redis.call("pexpire", key, ARGV[2])
	end
	return {ret, ttl}
end
ttl = redis.call("pttl", key)
return {ret, ttl}
end
local check = ulule({KEYS[2]}, {'1', '600000'})
if type(check) ~= 'table' or type(check[1]) ~= 'number' or check[1] < 1 then
  return redis.error_reply('ulule: no count')
end
`
}

// ourFastPath defines fast(KEYS, ARGV), the start of adapters/redisstore's
// script (its constants and its fast path, read from the module's Lua
// sources) as a function, and FK and FA, the keys and arguments with which
// the store takes one unit of the fixed window of policyArgs, on the
// server's clock: the call the store makes.
func ourFastPath(tb testing.TB) string {
	var src strings.Builder
	for _, f := range []string{"prelude.lua", "fast.lua"} {
		b, err := os.ReadFile(filepath.Join("..", "adapters", "redisstore", "lua", f))
		if err != nil {
			tb.Fatal(err)
		}
		src.Write(b)
		src.WriteString("\n")
	}
	return "local function fast(KEYS, ARGV)\n" + src.String() + "end\n" +
		"local FK, FA = {KEYS[1]}, {P, '1'}\n" +
		// The fast path decides (it does not fall through) and admits.
		"local check = fast(FK, FA)\n" +
		"if type(check) ~= 'table' or check[2] ~= 1 then return redis.error_reply('fast path: no admission') end\n"
}

// scriptLoop wraps body in a loop of ARGV[1] iterations, after setup,
// and returns the server's microseconds for the loop, read with TIME
// around it.
func scriptLoop(setup, body string) string {
	return `
local n = tonumber(ARGV[1])
local P = ARGV[2]
local V = 'f:29527333:17;f,1000000000,1000000,1000000000'
redis.call('SET', KEYS[1], V, 'PX', '600000')
redis.call('SET', KEYS[2], '0', 'PX', '600000')
local x
` + setup + `
local t0 = redis.call('TIME')
for i = 1, n do
` + body + `
end
local t1 = redis.call('TIME')
return (tonumber(t1[1]) - tonumber(t0[1])) * 1000000 + tonumber(t1[2]) - tonumber(t0[2])
`
}

// recordTag is the identity tag our store writes with a fixed window of
// the benchmarks' quota (1e9 per second): the algorithm's code, Limit,
// Window in microseconds, capacity.
const recordTag = "f,1000000000,1000000,1000000000"

// policyArgs is our script's policy argument for that fixed window, as
// adapters/redisstore encodes it: eight MessagePack values in a row (not an
// array), the algorithm's code as a fixstr, the tag as a raw16, then Window
// in microseconds, Limit, capacity, MaxDelay in microseconds and the
// quotient and remainder of capacity x Window / Limit, each in its shortest
// unsigned form.
var policyArgs = string(append(append([]byte{0xa1, 'f', 0xda, 0, byte(len(recordTag))}, recordTag...),
	0xce, 0x00, 0x0f, 0x42, 0x40, // Window: 1,000,000 µs
	0xce, 0x3b, 0x9a, 0xca, 0x00, // Limit: 1,000,000,000
	0xce, 0x3b, 0x9a, 0xca, 0x00, // capacity: 1,000,000,000
	0x00,                         // MaxDelay: 0
	0xce, 0x00, 0x0f, 0x42, 0x40, // quotient: 1,000,000
	0x00, // remainder: 0
))

// checkPolicyArgs is the decoding our script does, checked once.
const checkPolicyArgs = `
local ok, alg, tag, W, L, cap, md, tauQ, tauR = pcall(cmsgpack.unpack, ARGV[1])
if not ok or alg ~= 'f' or tag ~= ARGV[2] or W ~= 1000000 or L ~= 1000000000 or cap ~= 1000000000 or md ~= 0 or tauQ ~= 1000000 or tauR ~= 0 then
  return redis.error_reply('policy argument decodes as ' .. tostring(alg) .. ' ' .. tostring(tag) .. ' ' .. tostring(W) .. ' ' .. tostring(tauR))
end
return 1
`

// BenchmarkRedisScriptOp reports what each step of a fixed-window script
// costs redis-server, run b.N times in loops inside scripts: srv-ns/op is
// the server's own clock around the loop (ns/op adds one round trip per
// 20,000 iterations). Subtract the "loop" row for a step's own cost.
func BenchmarkRedisScriptOp(b *testing.B) {
	const chunk = 20_000
	for _, op := range scriptOps {
		b.Run(op.name, func(b *testing.B) {
			c, _ := redisClient(b, nil)
			ctx := context.Background()
			if err := c.Eval(ctx, checkPolicyArgs, nil, policyArgs, recordTag).Err(); err != nil {
				b.Fatal(err)
			}
			setup := ""
			if op.setup != nil {
				setup = op.setup(b)
			}
			script := redis.NewScript(scriptLoop(setup, op.body))
			keys := []string{"script-op:record", "script-op:counter"}
			// One run first: it loads the script and checks it.
			if _, err := script.Eval(ctx, c, keys, 1, policyArgs).Int64(); err != nil {
				b.Fatalf("%s: %v", op.name, err)
			}
			b.ResetTimer()
			var us int64
			for done := 0; done < b.N; done += chunk {
				n := min(chunk, b.N-done)
				v, err := script.EvalSha(ctx, c, keys, n, policyArgs).Int64()
				if err != nil {
					b.Fatalf("%s: %v", op.name, err)
				}
				us += v
			}
			b.ReportMetric(float64(us)*1e3/float64(b.N), "srv-ns/op")
		})
	}
}
