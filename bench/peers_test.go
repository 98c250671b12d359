package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/httprate"
	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
	"github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ulstdlib "github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

// The common quota: 2^30 requests per hour per key (a token bucket of 2^30
// refilled at ~298,000/s, or a window of 2^30 per hour), generous enough
// that every decision of every workload admits, as most do in production.
const (
	quotaLimit  = 1 << 30
	quotaWindow = time.Hour
)

// swlogLimit is the SlidingWindowLog row's Limit per second: that algorithm
// keeps up to 16 bytes per admission, so it cannot run with quotaLimit (as
// in core/bench_test.go). Its hot-key rows therefore mostly refuse.
const swlogLimit = 1000

// limiter is the one verb every peer is benchmarked through.
type limiter interface {
	Allow(key string) bool
}

// closer is implemented by limiters that own a goroutine or a connection.
type closer interface{ Close() }

// peer is one limiter library behind one small adapter.
type peer struct {
	name string
	// bound says whether and how the peer bounds the memory its keys use.
	bound string
	// newLimiter returns a limiter for the common quota holding at least
	// capacity keys (bounded peers use it as their bound).
	newLimiter func(tb testing.TB, capacity int) limiter
}

func closeLimiter(l limiter) {
	if c, ok := l.(closer); ok {
		c.Close()
	}
}

// ours returns the core rows: one per built-in algorithm, the token bucket
// (the default) first.
func ours() []peer {
	rows := []struct {
		name string
		rule core.Rule
	}{
		{"ratelimit", core.Rule{Limit: quotaLimit, Window: quotaWindow}},
		{"ratelimit-leaky", core.Rule{Algorithm: core.LeakyBucket, Limit: quotaLimit, Window: quotaWindow, Burst: quotaLimit}},
		{"ratelimit-fixedwindow", core.Rule{Algorithm: core.FixedWindow, Limit: quotaLimit, Window: quotaWindow}},
		{"ratelimit-swcounter", core.Rule{Algorithm: core.SlidingWindowCounter, Limit: quotaLimit, Window: quotaWindow}},
		{"ratelimit-swlog", core.Rule{Algorithm: core.SlidingWindowLog, Limit: swlogLimit, Window: time.Second}},
	}
	var ps []peer
	for _, r := range rows {
		rule := r.rule
		rule.Name = "bench"
		ps = append(ps, peer{
			name:  r.name,
			bound: "yes: sharded LRU, Capacity keys",
			newLimiter: func(tb testing.TB, capacity int) limiter {
				m, err := core.NewMemoryStore(&core.MemoryConfig{Capacity: capacity})
				if err != nil {
					tb.Fatal(err)
				}
				l, err := core.New(rule, core.WithStore(m))
				if err != nil {
					tb.Fatal(err)
				}
				return &coreLimiter{l: l, mem: m}
			},
		})
	}
	return ps
}

type coreLimiter struct {
	l    *core.Limiter
	mem  *core.MemoryStore // nil for another store
	errs atomic.Int64
	err  atomic.Pointer[error] // the first error
}

func (c *coreLimiter) Allow(key string) bool {
	d, err := c.l.Allow(context.Background(), key)
	if err != nil {
		c.errs.Add(1)
		first := err // only this copy escapes, on the error path
		c.err.CompareAndSwap(nil, &first)
		return false
	}
	return d.Allowed
}

// Len returns the number of keys the memory store holds (-1 for another
// store).
func (c *coreLimiter) Len() int {
	if c.mem == nil {
		return -1
	}
	return c.mem.Len()
}

// Failures returns the number of decisions that failed and the first error.
func (c *coreLimiter) Failures() (int64, error) {
	if p := c.err.Load(); p != nil {
		return c.errs.Load(), *p
	}
	return 0, nil
}

// failer is implemented by limiters that report their errors.
type failer interface{ Failures() (int64, error) }

// failures describes the errors of l, if it reports them.
func failures(l limiter) string {
	if f, ok := l.(failer); ok {
		if n, err := f.Failures(); n > 0 {
			return fmt.Sprintf("; %d errors, the first: %v", n, err)
		}
	}
	return ""
}

// peers returns every in-memory peer, ours first.
func peers() []peer {
	return append(ours(),
		peer{
			name:  "xtimerate",
			bound: "no: map grows with every key",
			newLimiter: func(testing.TB, int) limiter {
				return &xrateMap{m: make(map[string]*rate.Limiter)}
			},
		},
		peer{
			name:  "httprate",
			bound: "by window: both maps cleared each window, no key cap",
			newLimiter: func(testing.TB, int) limiter {
				// No response header names: the decision alone.
				return &httprateLimiter{rl: httprate.NewRateLimiter(quotaLimit, quotaWindow, httprate.WithResponseHeaders(httprate.ResponseHeaders{}))}
			},
		},
		peer{
			name:  "ulule",
			bound: "by TTL: expired keys swept every 30 s, no key cap",
			newLimiter: func(testing.TB, int) limiter {
				return &ululeLimiter{l: ulule.New(ulmemory.NewStore(), ulule.Rate{Period: quotaWindow, Limit: quotaLimit})}
			},
		},
		peer{
			name:  "sethvargo",
			bound: "by TTL: idle keys swept every 6 h, no key cap",
			newLimiter: func(tb testing.TB, _ int) limiter {
				s, err := memorystore.New(&memorystore.Config{Tokens: quotaLimit, Interval: quotaWindow})
				if err != nil {
					tb.Fatal(err)
				}
				return sethvargoLimiter{s}
			},
		},
		peer{
			name:  "throttled",
			bound: "no: plain map (memstore.New(0))",
			newLimiter: func(tb testing.TB, _ int) limiter {
				return newThrottled(tb, 0)
			},
		},
		peer{
			name:  "throttled-lru",
			bound: "yes: golang-lru v1, Capacity keys",
			newLimiter: func(tb testing.TB, capacity int) limiter {
				return newThrottled(tb, capacity)
			},
		},
		peer{
			name:  "echo",
			bound: "by TTL: idle keys dropped every 3 min (inline, whole map under lock), no key cap",
			newLimiter: func(testing.TB, int) limiter {
				return echoLimiter{newEchoStore()}
			},
		},
	)
}

// xrateMap is the common x/time/rate pattern: a mutex-guarded map of
// per-key limiters, never pruned.
type xrateMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (x *xrateMap) Allow(key string) bool {
	x.mu.Lock()
	l := x.m[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(float64(quotaLimit)/quotaWindow.Seconds()), quotaLimit)
		x.m[key] = l
	}
	x.mu.Unlock()
	return l.Allow()
}

// httprateLimiter decides through RateLimiter.OnLimit, httprate's only
// decision API, which takes a ResponseWriter and a request.
type httprateLimiter struct{ rl *httprate.RateLimiter }

var (
	discardReq = func() *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "http://example.com/", nil)
		return r
	}()
)

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) WriteHeader(int)             {}
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }

func (h *httprateLimiter) Allow(key string) bool {
	return !h.rl.OnLimit(discardWriter{}, discardReq, key)
}

type ululeLimiter struct{ l *ulule.Limiter }

func (u *ululeLimiter) Allow(key string) bool {
	c, err := u.l.Get(context.Background(), key)
	return err == nil && !c.Reached
}

type sethvargoLimiter struct {
	s interface {
		Take(ctx context.Context, key string) (uint64, uint64, uint64, bool, error)
		Close(ctx context.Context) error
	}
}

func (s sethvargoLimiter) Allow(key string) bool {
	_, _, _, ok, err := s.s.Take(context.Background(), key)
	return err == nil && ok
}

func (s sethvargoLimiter) Close() { s.s.Close(context.Background()) }

type throttledLimiter struct{ l *throttled.GCRARateLimiterCtx }

func throttledQuota() throttled.RateQuota {
	return throttled.RateQuota{MaxRate: throttled.PerDuration(quotaLimit, quotaWindow), MaxBurst: quotaLimit - 1}
}

func newThrottled(tb testing.TB, maxKeys int) throttledLimiter {
	st, err := memstore.NewCtx(maxKeys)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := throttled.NewGCRARateLimiterCtx(st, throttledQuota())
	if err != nil {
		tb.Fatal(err)
	}
	return throttledLimiter{l}
}

func (t throttledLimiter) Allow(key string) bool {
	limited, _, err := t.l.RateLimitCtx(context.Background(), key, 1)
	return err == nil && !limited
}

func newEchoStore() *echomw.RateLimiterMemoryStore {
	return echomw.NewRateLimiterMemoryStoreWithConfig(echomw.RateLimiterMemoryStoreConfig{
		Rate:  rate.Limit(float64(quotaLimit) / quotaWindow.Seconds()),
		Burst: quotaLimit,
	})
}

type echoLimiter struct {
	s *echomw.RateLimiterMemoryStore
}

func (e echoLimiter) Allow(key string) bool {
	ok, err := e.s.Allow(key)
	return err == nil && ok
}

// mwPeer is one HTTP middleware: its constructor wraps next, keyed by the
// client IP in the peer's usual way.
type mwPeer struct {
	name string
	// headers lists the rate-limit headers the peer writes on an admitted
	// request.
	headers string
	wrap    func(tb testing.TB, next http.Handler) http.Handler
}

func mwPeers() []mwPeer {
	ourRule := core.Rule{Name: "per-ip", Limit: quotaLimit, Window: quotaWindow}
	return []mwPeer{
		{
			name:    "ratelimit",
			headers: "X-RateLimit-Limit/Remaining/Reset + RateLimit-Policy + RateLimit",
			wrap: func(tb testing.TB, next http.Handler) http.Handler {
				l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: ourRule}}, ratelimit.WithHeaders(ratelimit.AllHeaders))
				if err != nil {
					tb.Fatal(err)
				}
				return l.Handler(next)
			},
		},
		{
			name:    "ratelimit-xonly",
			headers: "X-RateLimit-Limit/Remaining/Reset (the default set)",
			wrap: func(tb testing.TB, next http.Handler) http.Handler {
				l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: ourRule}})
				if err != nil {
					tb.Fatal(err)
				}
				return l.Handler(next)
			},
		},
		{
			name:    "httprate",
			headers: "X-RateLimit-Limit/Remaining/Reset",
			wrap: func(_ testing.TB, next http.Handler) http.Handler {
				return httprate.LimitByIP(quotaLimit, quotaWindow)(next)
			},
		},
		{
			name:    "ulule",
			headers: "X-RateLimit-Limit/Remaining/Reset",
			wrap: func(_ testing.TB, next http.Handler) http.Handler {
				l := ulule.New(ulmemory.NewStore(), ulule.Rate{Period: quotaWindow, Limit: quotaLimit})
				return ulstdlib.NewMiddleware(l).Handler(next)
			},
		},
		{
			name:    "sethvargo",
			headers: "X-RateLimit-Limit/Remaining/Reset",
			wrap: func(tb testing.TB, next http.Handler) http.Handler {
				s, err := memorystore.New(&memorystore.Config{Tokens: quotaLimit, Interval: quotaWindow})
				if err != nil {
					tb.Fatal(err)
				}
				tb.Cleanup(func() { s.Close(context.Background()) })
				m, err := httplimit.NewMiddleware(s, httplimit.IPKeyFunc())
				if err != nil {
					tb.Fatal(err)
				}
				return m.Handle(next)
			},
		},
		{
			name:    "throttled",
			headers: "X-RateLimit-Limit/Remaining/Reset",
			wrap: func(tb testing.TB, next http.Handler) http.Handler {
				t := &throttled.HTTPRateLimiterCtx{RateLimiter: newThrottled(tb, 0).l, VaryBy: &throttled.VaryBy{RemoteAddr: true}}
				return t.RateLimit(next)
			},
		},
		{
			name:    "echo",
			headers: "none (echo.ServeHTTP, router and context pool included)",
			wrap: func(_ testing.TB, next http.Handler) http.Handler {
				return newEcho(next, true)
			},
		},
		{
			name:    "xtimerate",
			headers: "none (hand-written: SplitHostPort + the map above)",
			wrap: func(_ testing.TB, next http.Handler) http.Handler {
				x := &xrateMap{m: make(map[string]*rate.Limiter)}
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ip, _, err := net.SplitHostPort(r.RemoteAddr)
					if err != nil {
						http.Error(w, "bad address", http.StatusBadRequest)
						return
					}
					if !x.Allow(ip) {
						http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
						return
					}
					next.ServeHTTP(w, r)
				})
			},
		},
		{
			name:    "bare",
			headers: "baseline: the handler alone, no limiter",
			wrap:    func(_ testing.TB, next http.Handler) http.Handler { return next },
		},
		{
			name:    "echo-bare",
			headers: "baseline: echo.ServeHTTP, no limiter",
			wrap:    func(_ testing.TB, next http.Handler) http.Handler { return newEcho(next, false) },
		},
	}
}

// newEcho returns an echo router serving next on "/", behind echo's rate
// limiter middleware (keyed by its default extractor, c.RealIP()) if limit.
func newEcho(next http.Handler, limit bool) *echo.Echo {
	e := echo.New()
	if limit {
		e.Use(echomw.RateLimiterWithConfig(echomw.RateLimiterConfig{Store: newEchoStore()}))
	}
	e.GET("/", echo.WrapHandler(next))
	return e
}
