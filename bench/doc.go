// Package bench compares github.com/limitry/ratelimit with other Go rate
// limiters on identical workloads. It is a module of its own, so that the
// peers it imports never enter the library's go.mod; everything lives in
// its _test.go files and cmd/chart. Run ./run.sh; see BENCHMARKS.md at the
// repository root.
package bench
