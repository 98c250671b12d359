package redisstore

import (
	"context"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/limitry/ratelimit/internal/redistest"
)

// TestLuaMulDiv checks the script's exact wide arithmetic, muldiv(a, b, c,
// d) = floor((a*b + c) / d) and the remainder, against math/big, on the
// boundaries of its contract (operands below 2^53, d below 2^51, quotient
// below 2^53) and on random operands within it.
func TestLuaMulDiv(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	script := composeScript([]string{"lua/prelude.lua", "lua/arith.lua"}) + `
local out = {}
for i = 1, #ARGV, 4 do
  local q, r = muldiv(tonumber(ARGV[i]), tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), tonumber(ARGV[i+3]))
  out[#out + 1] = sformat('%.0f %.0f', q, r)
end
return table.concat(out, ',')
`
	const p53, p51 = uint64(1) << 53, uint64(1) << 51
	type tc struct{ a, b, c, d uint64 }
	cases := []tc{
		{0, 0, 0, 1},
		{1, 1, 0, 1},
		{p53 - 1, 1, 0, 1},                   // largest exact product
		{p53 - 1, 1, 0, p51 - 1},             // largest divisor
		{1 << 26, 1 << 27, 0, 1 << 30},       // product exactly 2^53: wide path
		{1 << 26, 1 << 27, 1, 1 << 30},       // product 2^53 + 1
		{p53 - 1, p51 - 2, p51 - 2, p51 - 1}, // quotient just below 2^53
		{1 << 50, 1_576_800_000_000_000, 0, 1 << 50},
		{1 << 50, 1_576_800_000_000_000, (1 << 50) - 1, 1 << 50},
		{1_000_000, 86_400_000_000, 999_999, 1_000_000},
		{86_400_000_000, 1_000_000, 123, 86_400_000_000},
		{4_294_967_295, 315_360_000_000_000 - 1, 0, 315_360_000_000_000},
		{p53 - 1, 7, p53 - 1, 9}, // c near 2^53 on the wide path
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for len(cases) < 4000 {
		d := 1 + rng.Uint64N(p51-1)
		if rng.IntN(3) == 0 {
			d = 1 + rng.Uint64N(1<<uint(1+rng.IntN(50)))
		}
		a := rng.Uint64N(p53)
		if rng.IntN(2) == 0 {
			a = rng.Uint64N(1 << uint(1+rng.IntN(52)))
		}
		// Choose b so that the quotient stays below 2^53.
		maxB := new(big.Int).Div(new(big.Int).Mul(big.NewInt(int64(p53-1)), new(big.Int).SetUint64(d)), new(big.Int).SetUint64(max(a, 1)))
		if maxB.Cmp(new(big.Int).SetUint64(p53)) >= 0 {
			maxB.SetUint64(p53 - 1)
		}
		if maxB.Sign() == 0 {
			continue
		}
		b := rng.Uint64N(maxB.Uint64())
		c := rng.Uint64N(min(d, p53-1)) // the callers' c is a remainder below d
		if rng.IntN(4) == 0 {
			c = rng.Uint64N(p53)
		}
		q := new(big.Int).Mul(new(big.Int).SetUint64(a), new(big.Int).SetUint64(b))
		q.Add(q, new(big.Int).SetUint64(c))
		q.Div(q, new(big.Int).SetUint64(d))
		if q.Cmp(new(big.Int).SetUint64(p53)) >= 0 {
			continue
		}
		cases = append(cases, tc{a, b, c, d})
	}
	wide := 0
	for start := 0; start < len(cases); start += 500 {
		batch := cases[start:min(start+500, len(cases))]
		var args []any
		for _, k := range batch {
			args = append(args, strconv.FormatUint(k.a, 10), strconv.FormatUint(k.b, 10), strconv.FormatUint(k.c, 10), strconv.FormatUint(k.d, 10))
		}
		res, err := client.Eval(context.Background(), script, nil, args...).Text()
		if err != nil {
			t.Fatal(err)
		}
		for i, got := range strings.Split(res, ",") {
			k := batch[i]
			n := new(big.Int).Mul(new(big.Int).SetUint64(k.a), new(big.Int).SetUint64(k.b))
			if n.Cmp(new(big.Int).SetUint64(p53)) >= 0 {
				wide++
			}
			n.Add(n, new(big.Int).SetUint64(k.c))
			q, r := new(big.Int).QuoRem(n, new(big.Int).SetUint64(k.d), new(big.Int))
			if want := q.String() + " " + r.String(); got != want {
				t.Errorf("muldiv(%d, %d, %d, %d) = %s, want %s", k.a, k.b, k.c, k.d, got, want)
			}
		}
	}
	if wide < len(cases)/4 {
		t.Fatalf("only %d of %d cases took the wide path", wide, len(cases))
	}
	t.Logf("%d cases, %d on the wide path", len(cases), wide)
}
