// Package loadtest holds a bounded load run against the example servers, on
// loopback only. It is behind the loadtest build tag, so the normal test
// suite does not run it:
//
//	go test -tags loadtest -v ./internal/loadtest
//
// Each run builds an example, starts it on a free loopback port, sends
// requests from many goroutines for a fixed time, and checks that every
// response is a 200 or the expected 429, and that the server's resident
// memory stays flat. It prints the throughput it measured.
package loadtest
