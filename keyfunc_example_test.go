package ratelimit_test

import (
	"errors"
	"fmt"
	"net/http/httptest"

	"github.com/limitry/ratelimit"
)

// Behind a load balancer in 10.0.0.0/8, the client is the rightmost
// X-Forwarded-For entry outside that network. A client connecting directly
// is keyed by its own address, whatever headers it forges.
func ExampleClientIP() {
	key, err := ratelimit.ClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
	if err != nil {
		panic(err) // a bad CIDR is reported here, at start-up
	}

	viaProxy := httptest.NewRequest("GET", "/", nil)
	viaProxy.RemoteAddr = "10.0.0.7:41000" // the load balancer
	viaProxy.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.9, 10.0.0.12")
	fmt.Println(key(viaProxy))

	direct := httptest.NewRequest("GET", "/", nil)
	direct.RemoteAddr = "198.51.100.4:5555" // not a trusted proxy
	direct.Header.Set("X-Forwarded-For", "6.6.6.6")
	fmt.Println(key(direct))

	ipv6 := httptest.NewRequest("GET", "/", nil)
	ipv6.RemoteAddr = "[2001:db8:1:2:3:4:5:6]:443"
	fmt.Println(key(ipv6))

	garbage := httptest.NewRequest("GET", "/", nil)
	garbage.RemoteAddr = "10.0.0.7:41000"
	garbage.Header.Set("X-Forwarded-For", "203.0.113.9, not-an-ip")
	_, err = key(garbage)
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidClientIP))
	// Output:
	// 203.0.113.9 <nil>
	// 198.51.100.4 <nil>
	// 2001:db8:1:2::/64 <nil>
	// true
}

// Keys from a single-IP header set by a CDN, trusted only from the CDN.
func ExampleFromHeader() {
	key := ratelimit.MustClientIP(
		ratelimit.TrustedProxyCIDRs("173.245.48.0/20"), // one of the CDN's ranges
		ratelimit.FromHeader("CF-Connecting-IP"),
	)

	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "173.245.48.1:443"
	r.Header.Set("CF-Connecting-IP", "203.0.113.9")
	fmt.Println(key(r))
	// Output: 203.0.113.9 <nil>
}

// An API key is hashed before it becomes a store key; requests without one
// get ErrNoKey, so the per-key layer is skipped for them.
func ExampleHeader() {
	key := ratelimit.Header("X-API-Key", ratelimit.HashKey())

	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-API-Key", "sk_live_secret")
	fmt.Println(key(r))

	_, err := key(httptest.NewRequest("GET", "/", nil))
	fmt.Println(errors.Is(err, ratelimit.ErrNoKey))
	// Output:
	// 49ae2cdbc42204d2fc202281424e72bd <nil>
	// true
}

// A quota per user per route. If either part is missing the whole key is
// missing, so anonymous requests skip the layer instead of sharing a bucket.
func ExampleComposite() {
	key := ratelimit.Composite(ratelimit.User(), ratelimit.Route())

	r := httptest.NewRequest("POST", "/orders/42", nil)
	ctx := ratelimit.WithUser(r.Context(), "alice")
	ctx = ratelimit.WithRoute(ctx, "POST /orders/{id}")
	fmt.Println(key(r.WithContext(ctx)))

	_, err := key(r)
	fmt.Println(errors.Is(err, ratelimit.ErrNoKey))
	// Output:
	// 5:alice17:POST /orders/{id} <nil>
	// true
}

// Authentication middleware stores the user; the User key func reads it.
func ExampleUser() {
	key := ratelimit.User()

	r := httptest.NewRequest("GET", "/", nil)
	_, err := key(r)
	fmt.Println(err)

	r = r.WithContext(ratelimit.WithUser(r.Context(), "user-1234"))
	fmt.Println(key(r))
	// Output:
	// ratelimit: key does not apply to this request
	// user-1234 <nil>
}
