package ginlimit

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// TestRereadsBoundedAcrossPaths: a client spreading method-override
// requests over a service's paths (each path about once a second) makes
// engine.Routes run about once a second, not on every request: the
// waiting period is the engine's, and a reading refreshes every path.
func TestRereadsBoundedAcrossPaths(t *testing.T) {
	gin.SetMode(gin.TestMode)
	e := gin.New()
	const paths = 200
	hg := make([]gin.HandlerFunc, paths)
	for i := range paths {
		p := fmt.Sprintf("/r%d", i)
		hg[i] = func(c *gin.Context) { c.Status(http.StatusOK) }
		e.GET(p, hg[i])
		e.POST(p, func(c *gin.Context) { c.Status(http.StatusCreated) })
	}
	clk := time.Unix(1_800_000_000, 0)
	defer SetNow(func() time.Time { return clk })()
	ar := &anyRoutes{engine: e}
	var reqs, reads int
	for round := range 30 {
		for i := range paths {
			before := ar.snap.Load()
			// gin served GET /r<i>; an override before the limiter made it POST.
			if m := ar.method(fmt.Sprintf("/r%d", i), http.MethodPost, hg[i]); m != http.MethodGet {
				t.Fatalf("keyed by %q, want GET (the route gin served)", m)
			}
			if round >= 20 {
				reqs++
				if ar.snap.Load() != before {
					reads++
				}
			}
			clk = clk.Add(time.Second / paths) // 200 requests a second in all
		}
	}
	if reads > 12 {
		t.Fatalf("%d of %d requests over 10 s (200 a second over %d paths) read engine.Routes again; want about one a second", reads, reqs, paths)
	}
}

// TestRereadsConcurrent: concurrent requests in doubt key alike while the
// routes are read again.
func TestRereadsConcurrent(t *testing.T) {
	gin.SetMode(gin.TestMode)
	e := gin.New()
	hg := func(c *gin.Context) {}
	e.GET("/x", hg)
	e.POST("/x", func(c *gin.Context) {})
	ar := &anyRoutes{engine: e}
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 2000 {
				if m := ar.method("/x", http.MethodPost, hg); m != http.MethodGet {
					t.Errorf("keyed %q, want GET", m)
					return
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
}
