package ginlimit

import "time"

// SetNow sets the clock of the route rereads and returns a function that
// restores it.
func SetNow(f func() time.Time) (restore func()) {
	old := now
	now = f
	return func() { now = old }
}
