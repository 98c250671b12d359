package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
)

var allAlgorithms = []core.Algorithm{core.TokenBucket, core.LeakyBucket, core.FixedWindow, core.SlidingWindowLog, core.SlidingWindowCounter}

// TestIdentityCarryOver changes a key's policy under one name, for every
// pair of algorithms and with other parameters, and checks that the units
// in use carry over in absolute numbers (never misread, never reset), as
// decided at explicit instants.
func TestIdentityCarryOver(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	at := storetest.T0.Add(123 * time.Millisecond)
	for i, a := range allAlgorithms {
		for j, b := range allAlgorithms {
			for _, lim := range []int64{10, 20} {
				if a == b && lim == 10 {
					continue // the same policy
				}
				name := fmt.Sprintf("%s->%s/%d", a.Name(), b.Name(), lim)
				t.Run(name, func(t *testing.T) {
					key := fmt.Sprintf("k%d-%d-%d", i, j, lim)
					pa := mustPolicy(t, withBurst(core.Rule{Name: "shared", Algorithm: a, Limit: 10, Window: 10 * time.Minute}))
					pb := mustPolicy(t, withBurst(core.Rule{Name: "shared", Algorithm: b, Limit: lim, Window: 10 * time.Minute}))
					for range 3 {
						if d := take(t, s, at, pa, key, 1); !d.Allowed {
							t.Fatalf("under %s: refused %+v", pa, d)
						}
					}
					capB := pb.Capacity()
					d := take(t, s, at, pb, key, 1)
					if !d.Allowed || d.Remaining != capB-3-1 {
						t.Fatalf("first request under %s after 3 used under %s: %+v, want allowed with %d remaining", pb, pa, d, capB-3-1)
					}
					// The record is now pb's: decided as pb's own state.
					d = take(t, s, at, pb, key, 1)
					if !d.Allowed || d.Remaining != capB-3-2 {
						t.Fatalf("second request under %s: %+v, want %d remaining", pb, d, capB-3-2)
					}
				})
			}
		}
	}
}

// TestIdentityNeverCredits moves a key to a smaller policy: the units in
// use exceed its capacity, so the key is empty (refused, not reset). That
// conversion drops units, so it is not stored: the larger policy's record
// stays as it was (no credit when its requests return), and the smaller
// policy's retry time is when that record's units in use leave room.
func TestIdentityNeverCredits(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	big := mustPolicy(t, core.Rule{Name: "tier", Limit: 10, Window: time.Minute})
	small := mustPolicy(t, core.Rule{Name: "tier", Limit: 5, Window: time.Minute})
	at := storetest.T0
	for range 8 {
		take(t, s, at, big, "k", 1)
	}
	d := take(t, s, at, small, "k", 1)
	// 8 used of 10 (6s per token): room for one under 5 once 4 are back.
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != 24*time.Second {
		t.Fatalf("smaller policy after 8 of 10 used: %+v, want refused with 0 remaining, RetryAfter 24s", d)
	}
	if d := take(t, s, at, big, "k", 1); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("back to the larger policy: %+v, want 9 of 10 used (nothing credited)", d)
	}
	// 9 used now: room under 5 once 5 are back, at 30s.
	if d := take(t, s, at.Add(30*time.Second), small, "k", 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("30s after: %+v, want allowed with 0 remaining", d)
	}
}

// TestIdentityTwoStores runs two stores on one Redis and one prefix with
// equally named policies of different algorithms (a token bucket and a
// fixed window, 10 per minute): each reads what the other wrote as units
// in use, never as a fresh quota or a misread one.
func TestIdentityTwoStores(t *testing.T) {
	addr := redistest.Server(t)
	prefix := uniquePrefix(t)
	s1 := newStore(t, newClient(t, addr), &Config{Prefix: prefix, ClientTime: true})
	s2 := newStore(t, newClient(t, addr), &Config{Prefix: prefix, ClientTime: true})
	tb := mustPolicy(t, core.Rule{Name: "api", Algorithm: core.TokenBucket, Limit: 10, Window: time.Minute})
	fw := mustPolicy(t, core.Rule{Name: "api", Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute})
	at := storetest.T0
	for range 4 {
		take(t, s1, at, tb, "k", 1)
	}
	if d := take(t, s2, at, fw, "k", 1); !d.Allowed || d.Remaining != 5 {
		t.Fatalf("fixed window after 4 token-bucket units: %+v, want 5 remaining", d)
	}
	if d := take(t, s1, at, tb, "k", 1); !d.Allowed || d.Remaining != 4 {
		t.Fatalf("token bucket after 5 fixed-window units: %+v, want 4 remaining", d)
	}
	for range 4 {
		take(t, s1, at, tb, "k", 1)
	}
	if d := take(t, s2, at, fw, "k", 1); d.Allowed {
		t.Fatalf("fixed window after the bucket was emptied: %+v, want refused", d)
	}
}

// TestIdentityUntagged reads records without an identity tag (written by
// another program) as written under the requesting policy, and a record of
// another algorithm's shape without a tag as fresh.
func TestIdentityUntagged(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	ctx := context.Background()
	p := mustPolicy(t, core.Rule{Name: "api", Limit: 10, Window: 10 * time.Second})
	fw := mustPolicy(t, core.Rule{Name: "fw", Algorithm: core.FixedWindow, Limit: 10, Window: 10 * time.Second})
	at := storetest.T0
	us := at.UnixMicro()
	// TAT = now + 4 tokens (1s each): 6 left.
	client.Set(ctx, s.prefix+"api:old", fmt.Sprintf("g:%d:0", us+4_000_000), time.Hour)
	if d := take(t, s, at, p, "old", 1); !d.Allowed || d.Remaining != 5 {
		t.Fatalf("untagged bucket record: %+v, want 5 remaining", d)
	}
	client.Set(ctx, s.prefix+"fw:old", fmt.Sprintf("f:%d:7", us/10_000_000), time.Hour)
	if d := take(t, s, at, fw, "old", 1); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("untagged window record: %+v, want 2 remaining", d)
	}
	// A window count above the policy's capacity (the Limit was lowered
	// across the upgrade) is refused with nothing remaining, never less.
	client.Set(ctx, s.prefix+"fw:over", fmt.Sprintf("f:%d:14", us/10_000_000), time.Hour)
	if d := take(t, s, at, fw, "over", 1); d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
		t.Fatalf("untagged window record over capacity: %+v, want refused with 0 remaining", d)
	}
	client.Set(ctx, s.prefix+"api:other", "f:1:9", time.Hour)
	if d := take(t, s, at, p, "other", 1); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("untagged record of another algorithm: %+v, want fresh (9 remaining)", d)
	}
}

// TestClockBack empties a key, then decides it at earlier times: never a
// credit, and never refused for longer than the policy's recovery time
// (token and leaky bucket: the refill time; fixed window and sliding log:
// one Window; sliding counter: two Windows).
func TestClockBack(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	const w = 10 * time.Second
	for _, a := range allAlgorithms {
		recovery := w
		if a == core.SlidingWindowCounter {
			recovery = 2 * w
		}
		for _, back := range []time.Duration{time.Hour, storetest.T0.Sub(time.Unix(0, 0)), storetest.T0.Sub(time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC))} {
			t.Run(fmt.Sprintf("%s/%v", a.Name(), back), func(t *testing.T) {
				p := mustPolicy(t, core.Rule{Name: "cb", Algorithm: a, Limit: 5, Window: w})
				key := fmt.Sprintf("%s-%d", a.Name(), back)
				at := storetest.T0
				for range int(p.Capacity()) {
					take(t, s, at, p, key, 1)
				}
				early := at.Add(-back)
				d := take(t, s, early, p, key, 1)
				if d.Allowed {
					t.Fatalf("%v back: an emptied key was credited: %+v", back, d)
				}
				if d.RetryAfter > recovery || d.ResetAfter > recovery {
					t.Fatalf("%v back: RetryAfter %v, ResetAfter %v, beyond the recovery time %v", back, d.RetryAfter, d.ResetAfter, recovery)
				}
				if d := take(t, s, early.Add(recovery), p, key, p.Capacity()); !d.Allowed {
					t.Fatalf("%v back: still refused a whole capacity after the recovery time: %+v", back, d)
				}
			})
		}
	}
}

// TestNeverSeenKeyWhole decides new keys at times before 1970, at MinTime
// and at the epoch: each is whole.
func TestNeverSeenKeyWhole(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	for _, a := range allAlgorithms {
		p := mustPolicy(t, core.Rule{Name: "new", Algorithm: a, Limit: 5, Window: time.Minute})
		for i, at := range []time.Time{MinTime, time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(-1, 0), time.Unix(0, 0), time.Unix(0, 1000)} {
			d := take(t, s, at, p, fmt.Sprintf("%s-%d", a.Name(), i), 1)
			if !d.Allowed || d.Remaining != p.Capacity()-1 {
				t.Errorf("%s at %v: %+v, want whole (allowed, %d remaining)", a.Name(), at, d, p.Capacity()-1)
			}
		}
	}
}
