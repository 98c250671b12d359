package ratelimit

import (
	"context"
	"time"
)

// SetWaitFunc replaces the function l waits for shaping delays with, so that
// tests can observe the requested delays without real timers. Call it
// before l serves requests.
func SetWaitFunc(l *Limiter, f func(ctx context.Context, d time.Duration) error) { l.sleep = f }

// Waiting returns the number of requests l counts as waiting.
func Waiting(l *Limiter) int64 { return l.waiting.Load() }

// SetIdempotencySleep replaces the function f pauses with while another
// request holds the claim on a key.
func SetIdempotencySleep(f *Idempotency, sleep func(ctx context.Context, d time.Duration) error) {
	f.sleep = sleep
}

// ParseIPv4Port and ParseIPEntryHostFull are the one-pass IPv4 parser of
// RemoteAddr and the full parser it stands in front of; ParseIPEntryHost
// is the two together.
var (
	ParseIPv4Port        = parseIPv4Port
	ParseIPEntryHostFull = parseIPEntryHostFull
	ParseIPEntryHost     = parseIPEntryHost
)

// RedirectPath is redirectPath: whether pattern, what a ServeMux returned
// for r, is the target of its trailing-slash redirect.
var RedirectPath = redirectPath
