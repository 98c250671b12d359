package redisstore

import (
	"context"
	"embed"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The script is composed of one Lua source per algorithm (each defining
// load, decide, commit and refund for its state) between the exact
// integer arithmetic and helpers (arith.lua, helpers.lua) and the batch
// logic of main.lua, so one call can decide a batch that mixes
// algorithms. fast.lua, between the constants of prelude.lua and those
// closures, decides the usual call (one request taken under a token
// bucket, a leaky bucket or a fixed window) with the same arithmetic and
// returns before the rest is set up. A single take comes with short
// arguments (see fast.lua), which shortargs.lua rewrites in main.lua's
// form when fast.lua leaves the request to the rest.
//
//go:embed lua/*.lua
var luaFiles embed.FS

var luaParts = []string{
	"lua/prelude.lua",
	"lua/fast.lua",
	"lua/arith.lua",
	"lua/shortargs.lua",
	"lua/helpers.lua",
	"lua/gcra.lua",
	"lua/fixed_window.lua",
	"lua/sliding_counter.lua",
	"lua/sliding_log.lua",
	"lua/records.lua",
	"lua/main.lua",
}

// composeScript joins the embedded Lua files parts into one script.
func composeScript(parts []string) string {
	var b strings.Builder
	for _, name := range parts {
		src, err := luaFiles.ReadFile(name)
		if err != nil {
			panic("redisstore: missing embedded " + name)
		}
		b.WriteString("-- ")
		b.WriteString(name)
		b.WriteString("\n")
		b.Write(src)
		b.WriteString("\n")
	}
	return b.String()
}

var (
	scriptSource = composeScript(luaParts)
	// takeScript gives the script's SHA1 and its source: it is run with
	// EVALSHA, and with EVAL when the server answers NOSCRIPT.
	takeScript = redis.NewScript(scriptSource)
	takeLua    = newBoxedScript(scriptSource)

	// The command names of the script's calls, boxed once.
	evalshaArg, evalArg any = "evalsha", "eval"
)

// boxedScript is a script's SHA1 and source, boxed once as EVALSHA's and
// EVAL's second argument.
type boxedScript struct{ hash, source any }

func newBoxedScript(source string) *boxedScript {
	return &boxedScript{hash: redis.NewScript(source).Hash(), source: source}
}

// noRetryCmd is a script call go-redis must not send twice: once its bytes
// may have reached the server, the script may have run and charged, so a
// network error or a read timeout is returned rather than retried, whatever
// the client's MaxRetries. (go-redis still retries failures that happen
// before the command is written, such as a failed dial, and follows
// MOVED/ASK redirections, which mean the command did not run.)
// Each wraps the command's pointer alone, so it converts to redis.Cmder
// without an allocation.
type noRetryCmd struct{ *redis.StringCmd }

// NoRetry implements redis.Cmder.
func (noRetryCmd) NoRetry() bool { return true }

// noRetryInts is noRetryCmd for a command replying with integers.
type noRetryInts struct{ *redis.IntSliceCmd }

// NoRetry implements redis.Cmder.
func (noRetryInts) NoRetry() bool { return true }

// eval runs the script sc with EVALSHA and, if the server does not have it
// (NOSCRIPT: after a restart, a failover or SCRIPT FLUSH; nothing ran),
// with EVAL, which also caches it. It does what redis.Script.Run does,
// without the client's retries of a command that may have run. The reply
// is the take script's array of integers.
func eval(ctx context.Context, c redis.UniversalClient, sc *boxedScript, args []any) ([]int64, error) {
	args[0], args[1] = evalshaArg, sc.hash
	cmd := redis.NewIntSliceCmd(ctx, args...)
	_ = c.Process(ctx, noRetryInts{cmd})
	err := cmd.Err()
	if err != nil && isNoScript(err) {
		args[0], args[1] = evalArg, sc.source
		cmd = redis.NewIntSliceCmd(ctx, args...)
		_ = c.Process(ctx, noRetryInts{cmd})
		err = cmd.Err()
	}
	if err != nil {
		return nil, err
	}
	return cmd.Val(), nil
}

func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}
