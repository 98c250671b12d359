package ratelimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/limitry/ratelimit"
)

// hdr is one request header line.
type hdr struct{ name, value string }

// newReq builds a GET request from remoteAddr carrying the header lines in
// order (repeated names become repeated lines).
func newReq(t testing.TB, remoteAddr string, hs ...hdr) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = remoteAddr
	for _, h := range hs {
		r.Header.Add(h.name, h.value)
	}
	return r
}

func xff(v string) hdr    { return hdr{"X-Forwarded-For", v} }
func fwd(v string) hdr    { return hdr{"Forwarded", v} }
func realIP(v string) hdr { return hdr{"X-Real-IP", v} }
func mustKF(t testing.TB, opts ...ratelimit.IPOption) ratelimit.KeyFunc {
	t.Helper()
	fn, err := ratelimit.ClientIP(opts...)
	if err != nil {
		t.Fatalf("ClientIP: %v", err)
	}
	return fn
}

// keyCase is a request and the key (or error) it must produce.
type keyCase struct {
	name    string
	remote  string
	headers []hdr
	want    string // expected key when wantErr is nil
	wantErr error  // expected errors.Is target
}

// runKeyCases runs cases against fn and checks the KeyFunc contract: never
// ("", nil), and a key error never comes with a key.
func runKeyCases(t *testing.T, fn ratelimit.KeyFunc, cases []keyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key, err := fn(newReq(t, tc.remote, tc.headers...))
			checkContract(t, key, err)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got (%q, %v), want error %v", key, err, tc.wantErr)
				}
				return
			}
			if err != nil || key != tc.want {
				t.Fatalf("got (%q, %v), want %q", key, err, tc.want)
			}
		})
	}
}

func checkContract(t testing.TB, key string, err error) {
	t.Helper()
	if err == nil && key == "" {
		t.Fatal(`KeyFunc returned ("", nil)`)
	}
	if err != nil && key != "" {
		t.Fatalf("KeyFunc returned key %q with error %v", key, err)
	}
}

// forged headers every spoofing case sends.
var forged = []hdr{
	xff("6.6.6.6"), xff("10.0.0.9"),
	realIP("6.6.6.6"),
	fwd("for=6.6.6.6"),
	{"CF-Connecting-IP", "6.6.6.6"},
	{"True-Client-IP", "6.6.6.6"},
}

func TestHeader(t *testing.T) {
	long := strings.Repeat("k", ratelimit.MaxHeaderKeyLen+1)
	cases := []struct {
		name    string
		fn      ratelimit.KeyFunc
		headers []hdr
		want    string
		wantErr error
	}{
		{"value", ratelimit.Header("X-API-Key"), []hdr{{"X-Api-Key", "abc123"}}, "abc123", nil},
		{"name case-insensitive", ratelimit.Header("x-api-key"), []hdr{{"X-API-KEY", "abc123"}}, "abc123", nil},
		{"first line", ratelimit.Header("X-API-Key"), []hdr{{"X-API-Key", "first"}, {"X-API-Key", "second"}}, "first", nil},
		{"missing", ratelimit.Header("X-API-Key"), nil, "", ratelimit.ErrNoKey},
		{"empty", ratelimit.Header("X-API-Key"), []hdr{{"X-API-Key", ""}}, "", ratelimit.ErrNoKey},
		{"blank", ratelimit.Header("X-API-Key"), []hdr{{"X-API-Key", "  "}}, "", ratelimit.ErrNoKey},
		{"at limit", ratelimit.Header("X-API-Key"), []hdr{{"X-API-Key", long[1:]}}, long[1:], nil},
		{"too long", ratelimit.Header("X-API-Key"), []hdr{{"X-API-Key", long}}, "", ratelimit.ErrKeyTooLong},
		{"hashed", ratelimit.Header("X-API-Key", ratelimit.HashKey()), []hdr{{"X-API-Key", "abc123"}}, sha16("abc123"), nil},
		{"hashed long", ratelimit.Header("X-API-Key", ratelimit.HashKey()), []hdr{{"X-API-Key", long}}, sha16(long), nil},
		{"hashed missing", ratelimit.Header("X-API-Key", ratelimit.HashKey()), nil, "", ratelimit.ErrNoKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key, err := tc.fn(newReq(t, "192.0.2.1:1", tc.headers...))
			checkContract(t, key, err)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got (%q, %v), want %v", key, err, tc.wantErr)
				}
				return
			}
			if err != nil || key != tc.want {
				t.Fatalf("got (%q, %v), want %q", key, err, tc.want)
			}
		})
	}
}

func sha16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

func TestHeaderHashHidesSecret(t *testing.T) {
	fn := ratelimit.Header("Authorization", ratelimit.HashKey())
	seen := map[string]bool{}
	for _, secret := range []string{"Bearer s3cr3t-token", "Bearer s3cr3t-token2", "k"} {
		key, err := fn(newReq(t, "192.0.2.1:1", hdr{"Authorization", secret}))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(key, "s3cr3t") || strings.Contains(key, secret) {
			t.Fatalf("key %q contains the secret", key)
		}
		if len(key) != 32 || strings.Trim(key, "0123456789abcdef") != "" {
			t.Fatalf("key %q is not 32 lowercase hex digits", key)
		}
		if seen[key] {
			t.Fatalf("key %q repeated for a different secret", key)
		}
		seen[key] = true
		again, _ := fn(newReq(t, "192.0.2.1:1", hdr{"Authorization", secret}))
		if again != key {
			t.Fatalf("unstable key: %q then %q", key, again)
		}
	}
}

// A header name no request could carry (empty, or with a colon pasted
// along, a space, a non-token byte), or one net/http's server takes out of
// r.Header (Host, Transfer-Encoding, Trailer, in any case), would leave the
// layer without a key on every request: Header panics instead.
func TestHeaderPanicsOnInvalidName(t *testing.T) {
	for _, name := range []string{"", "X-API-Key:", "X API Key", "X-API-Key\x00", "Ключ", "Host", "host", " HOST ", "Transfer-Encoding", "trailer"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Header(%q) did not panic", name)
				}
			}()
			ratelimit.Header(name)
		}()
	}
}

func TestHeaderAllocs(t *testing.T) {
	r := newReq(t, "192.0.2.1:1", hdr{"X-Api-Key", strings.Repeat("k", 100)})
	raw, hashed := ratelimit.Header("X-API-Key"), ratelimit.Header("X-API-Key", ratelimit.HashKey())
	if n := testing.AllocsPerRun(100, func() { _, _ = raw(r) }); n > 0 {
		t.Errorf("raw: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = hashed(r) }); n > 2 {
		t.Errorf("hashed: %v allocs, want <= 2", n)
	}
}

func TestUser(t *testing.T) {
	fn := ratelimit.User()
	cases := []struct {
		name    string
		ctx     context.Context
		want    string
		wantErr error
	}{
		{"no user", context.Background(), "", ratelimit.ErrNoKey},
		{"empty user", ratelimit.WithUser(context.Background(), ""), "", ratelimit.ErrNoKey},
		{"user", ratelimit.WithUser(context.Background(), "alice"), "alice", nil},
		{"innermost wins", ratelimit.WithUser(ratelimit.WithUser(context.Background(), "alice"), "bob"), "bob", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newReq(t, "192.0.2.1:1").WithContext(tc.ctx)
			key, err := fn(r)
			checkContract(t, key, err)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got (%q, %v), want %v", key, err, tc.wantErr)
				}
			} else if err != nil || key != tc.want {
				t.Fatalf("got (%q, %v), want %q", key, err, tc.want)
			}
			u, ok := ratelimit.UserFromContext(tc.ctx)
			if u != tc.want || ok != (tc.want != "") {
				t.Fatalf("UserFromContext = (%q, %v)", u, ok)
			}
		})
	}
}

func TestRouteWithRoute(t *testing.T) {
	fn := ratelimit.Route()
	cases := []struct {
		name    string
		method  string
		ctx     context.Context
		pattern string // r.Pattern
		want    string
		wantErr error
	}{
		{"with route", "GET", ratelimit.WithRoute(context.Background(), "GET /users/{id}"), "", "GET /users/{id}", nil},
		{"with route any method", "PUT", ratelimit.WithRoute(context.Background(), "/login"), "", "/login", nil},
		{"with route ignores the request method", "X1", ratelimit.WithRoute(context.Background(), "/login"), "", "/login", nil},
		{"with route wins over r.Pattern", "GET", ratelimit.WithRoute(context.Background(), "GET /users/:id"), "GET /other", "GET /users/:id", nil},
		{"empty route: routed, unmatched", "GET", ratelimit.WithRoute(context.Background(), ""), "/items/", "", ratelimit.ErrNoKey},
		{"r.Pattern HEAD counted with GET", "HEAD", context.Background(), "GET /items/{id}", "GET /items/{id}", nil},
		{"r.Pattern without method", "POST", context.Background(), "/login", "/login", nil},
		{"r.Pattern with host", "GET", context.Background(), "GET example.com/x", "GET example.com/x", nil},
		{"r.Pattern tab normalised", "POST", context.Background(), "POST\t /x", "POST /x", nil},
		{"none: not routed", "GET", context.Background(), "", "", ratelimit.ErrNoRoute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequestWithContext(tc.ctx, tc.method, "/users/42", nil)
			r.Pattern = tc.pattern
			key, err := fn(r)
			checkContract(t, key, err)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got (%q, %v), want %v", key, err, tc.wantErr)
				}
				return
			}
			if err != nil || key != tc.want {
				t.Fatalf("got (%q, %v), want %q", key, err, tc.want)
			}
		})
	}
}

func TestRouteServeMux(t *testing.T) {
	fn := ratelimit.Route()
	var got string
	mux := http.NewServeMux()
	handler := func(w http.ResponseWriter, r *http.Request) {
		key, err := fn(r)
		if err != nil {
			got = "error: " + err.Error()
			return
		}
		got = key
	}
	mux.HandleFunc("GET /items/{id}", handler)
	mux.HandleFunc("/things/", handler)
	mux.HandleFunc("POST\t/tabbed", handler)
	cases := []struct{ method, path, want string }{
		{"GET", "/items/1", "GET /items/{id}"},
		{"GET", "/items/2", "GET /items/{id}"},
		{"HEAD", "/items/1", "GET /items/{id}"},
		{"DELETE", "/things/a/b", "/things/"},
		{"X1", "/things/a/b", "/things/"},
		{"post", "/things/", "/things/"},
		{"POST", "/tabbed", "POST /tabbed"},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			got = ""
			mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(tc.method, tc.path, nil))
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRawPath(t *testing.T) {
	fn := ratelimit.RawPath()
	long := "/" + strings.Repeat("a", 2*ratelimit.MaxRawPathKeyLen)
	cases := []struct{ name, method, target, want string }{
		{"path", "GET", "/users/42", "GET /users/42"},
		{"query ignored", "POST", "/users/42?x=1", "POST /users/42"},
		{"root", "GET", "/", "GET /"},
		{"long truncated", "GET", long, "GET " + long[:ratelimit.MaxRawPathKeyLen]},
		// A handler that serves any method must not give a quota per
		// spelling: HEAD is GET, and every non-standard method is one class.
		{"head is get", "HEAD", "/search", "GET /search"},
		{"standard method", "DELETE", "/search", "DELETE /search"},
		{"patch", "PATCH", "/search", "PATCH /search"},
		{"other method", "X1", "/search", "OTHER /search"},
		{"another other method", "X2", "/search", "OTHER /search"},
		{"lower-case spelling", "get", "/search", "OTHER /search"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key, err := fn(httptest.NewRequest(tc.method, tc.target, nil))
			checkContract(t, key, err)
			if err != nil || key != tc.want {
				t.Fatalf("got (%q, %v), want %q", key, err, tc.want)
			}
		})
	}
	t.Run("nil URL", func(t *testing.T) {
		key, err := fn(&http.Request{})
		checkContract(t, key, err)
		if err != nil || key != "GET " {
			t.Fatalf("got (%q, %v)", key, err)
		}
	})
}

func keyErr(err error) ratelimit.KeyFunc {
	return func(*http.Request) (string, error) { return "", err }
}

func TestComposite(t *testing.T) {
	g := ratelimit.Global
	errBackend := errors.New("backend down")
	cases := []struct {
		name    string
		fn      ratelimit.KeyFunc
		ctx     context.Context
		want    string
		wantErr error
	}{
		{"one part", ratelimit.Composite(g("a")), nil, "1:a", nil},
		{"parts", ratelimit.Composite(g("a|b"), g("c")), nil, "3:a|b1:c", nil},
		{"user and route", ratelimit.Composite(ratelimit.User(), ratelimit.Route()),
			ratelimit.WithRoute(ratelimit.WithUser(context.Background(), "alice"), "GET /users/{id}"), "5:alice15:GET /users/{id}", nil},
		{"missing part skips", ratelimit.Composite(ratelimit.User(), g("x")), nil, "", ratelimit.ErrNoKey},
		{"missing last part skips", ratelimit.Composite(g("x"), ratelimit.User()), nil, "", ratelimit.ErrNoKey},
		{"error part", ratelimit.Composite(g("x"), keyErr(errBackend)), nil, "", errBackend},
		{"empty part", ratelimit.Composite(g("x"), keyErr(nil)), nil, "", ratelimit.ErrEmptyKey},
		{"many parts", ratelimit.Composite(g("a"), g("b"), g("c"), g("d"), g("e"), g("ffffffffff")), nil, "1:a1:b1:c1:d1:e10:ffffffffff", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newReq(t, "192.0.2.1:1")
			if tc.ctx != nil {
				r = r.WithContext(tc.ctx)
			}
			key, err := tc.fn(r)
			checkContract(t, key, err)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got (%q, %v), want %v", key, err, tc.wantErr)
				}
				return
			}
			if err != nil || key != tc.want {
				t.Fatalf("got (%q, %v), want %q", key, err, tc.want)
			}
		})
	}
}

func TestCompositeUnambiguous(t *testing.T) {
	g := ratelimit.Global
	// Each pair must encode differently.
	pairs := [][2][]string{
		{{"a|b", "c"}, {"a", "b|c"}},
		{{"a:b", "c"}, {"a", "b:c"}},
		{{"12", "3"}, {"1", "23"}},
		{{"1:a", "b"}, {"1", "a1:b"}},
		{{"ab"}, {"a", "b"}},
		{{"1:a"}, {"a"}},
		{{"a", "b", "c"}, {"a", "bc"}},
	}
	build := func(parts []string) string {
		fns := make([]ratelimit.KeyFunc, len(parts))
		for i, p := range parts {
			fns[i] = g(p)
		}
		k, err := ratelimit.Composite(fns...)(newReq(t, "192.0.2.1:1"))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	for _, p := range pairs {
		a, b := build(p[0]), build(p[1])
		if a == b {
			t.Errorf("%q and %q both encode as %q", p[0], p[1], a)
		}
	}
}

func TestConstructionPanics(t *testing.T) {
	cases := map[string]func(){
		"composite empty": func() { ratelimit.Composite() },
		"composite nil":   func() { ratelimit.Composite(ratelimit.Global("a"), nil) },
		"global empty":    func() { ratelimit.Global("") },
		"header empty":    func() { ratelimit.Header(" ") },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}

func TestGlobal(t *testing.T) {
	fn := ratelimit.Global("all")
	for _, remote := range []string{"192.0.2.1:1", "[2001:db8::1]:1"} {
		key, err := fn(newReq(t, remote))
		if err != nil || key != "all" {
			t.Fatalf("got (%q, %v)", key, err)
		}
	}
}

func BenchmarkComposite(b *testing.B) {
	fn := ratelimit.Composite(ratelimit.Header("X-API-Key", ratelimit.HashKey()), ratelimit.RawPath())
	r := newReq(b, "192.0.2.1:1", hdr{"X-API-Key", "abc123"})
	b.ReportAllocs()
	for b.Loop() {
		_, _ = fn(r)
	}
}

func TestFirstOf(t *testing.T) {
	user, apiKey := ratelimit.User(), ratelimit.Header("X-API-Key")
	fn := ratelimit.FirstOf(user, apiKey, ratelimit.Global("anon"))
	cases := []struct {
		name    string
		ctx     context.Context
		hdrs    []hdr
		want    string
		wantErr error
	}{
		{"user first", ratelimit.WithUser(context.Background(), "alice"), []hdr{{"X-API-Key", "k"}}, "0:alice", nil},
		{"falls back to header", context.Background(), []hdr{{"X-API-Key", "k"}}, "1:k", nil},
		{"falls back to the last", context.Background(), nil, "2:anon", nil},
		{"a user named like a key stays apart", ratelimit.WithUser(context.Background(), "k"), nil, "0:k", nil},
		{"key error is not passed over", context.Background(), []hdr{{"X-API-Key", strings.Repeat("x", ratelimit.MaxHeaderKeyLen+1)}}, "", ratelimit.ErrKeyTooLong},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key, err := fn(newReq(t, "192.0.2.1:1", tc.hdrs...).WithContext(tc.ctx))
			checkContract(t, key, err)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got (%q, %v), want %v", key, err, tc.wantErr)
				}
				return
			}
			if err != nil || key != tc.want {
				t.Fatalf("got (%q, %v), want %q", key, err, tc.want)
			}
		})
	}
	if _, err := ratelimit.FirstOf(user, apiKey)(newReq(t, "192.0.2.1:1")); !errors.Is(err, ratelimit.ErrNoKey) {
		t.Fatalf("no part applies: %v, want ErrNoKey", err)
	}
	for _, bad := range [][]ratelimit.KeyFunc{nil, {user, nil}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("FirstOf(%d funcs) did not panic", len(bad))
				}
			}()
			ratelimit.FirstOf(bad...)
		}()
	}
}
