package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// Past maxCachedPolicies policies (a Resolver making a policy per tenant,
// rules reloaded over and over), a policy met later is still cached: its
// info is computed once, not on every call, and the cache stays bounded.
func TestPolicyCacheKeepsCachingPastItsBound(t *testing.T) {
	for i := 0; i < maxCachedPolicies+10; i++ {
		infoOf(core.MustPolicy(core.Rule{Name: fmt.Sprint("p", i), Limit: 5, Window: time.Minute}))
	}
	p := core.MustPolicy(core.Rule{Name: "late", Limit: 5, Window: time.Minute})
	if a, b := infoOf(p), infoOf(p); a != b {
		t.Fatal("a policy met after the cache filled is computed on every call")
	}
	if n := policyCache.Load().n.Load(); n > maxCachedPolicies {
		t.Fatalf("%d infos in the cache's generation, bound %d", n, maxCachedPolicies)
	}
}
