package ratelimit

import (
	"context"
	"net/http"
	"time"
)

// SetTransportSleep replaces the function t waits with, so that tests can
// observe and control the waits without real timers. Call it before t
// sends requests.
func SetTransportSleep(t *Transport, f func(ctx context.Context, d time.Duration) error) { t.sleep = f }

// TransportPauses returns the number of keys whose pause t remembers.
func TransportPauses(t *Transport) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pauses.Len()
}

// ServerPause is serverPause, for tests of the header parsing alone.
func ServerPause(status int, h http.Header, now time.Time, maxPause time.Duration) time.Duration {
	return serverPause(status, h, now, maxPause)
}
