#!/usr/bin/env bash
# run.sh: the whole comparison in one command (about 25 minutes on 2 cores with COUNT=8).
#
#   cd bench && ./run.sh            # everything
#   cd bench && ./run.sh profiles   # only the profiles, then the report
#   cd bench && ./run.sh report     # only the tables and chart, from results/
#   cd bench && ./run.sh lease      # only the quota-lease workloads (about 2 minutes)
#   cd bench && ./run.sh steps      # only Keys100kParallel split into steps (about 2 minutes)
#   cd bench && ./run.sh machine    # only the cost of a cache line two cores write, and of a mutex spin (about 1 minute)
#
# Runs every workload COUNT times (default 6), round-robin so that machine
# noise spreads over every peer alike, with -benchmem; writes the raw output
# to results/raw-*.txt, benchstat's summary to results/benchstat.txt, our
# CPU and memory profiles to results/profiles/*.txt, then regenerates the
# tables of ../BENCHMARKS.md and results/chart.svg with cmd/chart.
#
# Environment: COUNT (runs per benchmark, default 6), BENCHTIME (per run,
# default 0.5s; the 1,000,000-key heap workload always runs once per round),
# PROFILES=0 to skip the profiles. redis-server must be on PATH for the
# Redis rows (they are skipped otherwise).
set -euo pipefail
cd "$(dirname "$0")"

MODE=${1:-all}
COUNT=${COUNT:-6}
BENCHTIME=${BENCHTIME:-0.5s}
BENCHSTAT=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
OUT=results
mkdir -p "$OUT/profiles"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/bench.test
go test -c -o "$bin" .

# solo NAME PATTERN: COUNT rounds of the benchmarks matching PATTERN alone,
# into their own raw file and benchstat summary; BENCHMARKS.md's figures
# for them are written from these by hand.
solo() {
	: >"$OUT/$1-raw.txt"
	for i in $(seq "$COUNT"); do
		echo "== round $i of $COUNT"
		"$bin" -test.run '^$' -test.bench "$2" -test.benchtime "$BENCHTIME" -test.benchmem -test.count 1 |
			tee -a "$OUT/$1-raw.txt" | grep -E '^(Benchmark|FAIL|---|panic)' || true
	done
	go run "$BENCHSTAT" "$OUT/$1-raw.txt" >"$OUT/$1-benchstat.txt"
	cat "$OUT/$1-benchstat.txt"
}

if [ "$MODE" = lease ]; then
	# Quota leases and the refused-key cache (lease_test.go).
	solo lease '^Benchmark(Lease|RefusedKey)'
	exit 0
fi

if [ "$MODE" = machine ]; then
	# What the machine charges for a cache line two cores write
	# (machine_test.go).
	solo machine '^Benchmark(CacheLine|SpinRound)$'
	exit 0
fi

if [ "$MODE" = steps ]; then
	# Keys100kParallel split into steps (core's
	# BenchmarkKeys100kParallelSteps), each round beside the Keys100kParallel
	# rows of ours and sethvargo: their own raw file and benchstat summary;
	# BENCHMARKS.md's figures for them are written from these by hand.
	(cd .. && go test -c -o "$tmp/core.test" ./core)
	: >"$OUT/steps-raw.txt"
	for i in $(seq "$COUNT"); do
		echo "== round $i of $COUNT"
		{
			"$tmp/core.test" -test.run '^$' -test.bench '^BenchmarkKeys100kParallelSteps$' -test.benchtime "$BENCHTIME" -test.benchmem -test.count 1
			"$bin" -test.run '^$' -test.bench '^BenchmarkKeys100kParallel$/^(ratelimit|sethvargo)$' -test.benchtime "$BENCHTIME" -test.benchmem -test.count 1
		} | tee -a "$OUT/steps-raw.txt" | grep -E '^(Benchmark|FAIL|---|panic)' || true
	done
	go run "$BENCHSTAT" "$OUT/steps-raw.txt" >"$OUT/steps-benchstat.txt"
	cat "$OUT/steps-benchstat.txt"
	exit 0
fi

if [ "$MODE" = all ]; then
	rm -f "$OUT"/raw-*.txt
	{
		echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')$(grep -qw hypervisor /proc/cpuinfo && echo ', virtualised'))"
		echo "cores: $(nproc) (GOMAXPROCS $(nproc))"
		echo "go: $(go version | cut -d' ' -f3-)"
		echo "os: $(uname -sr)"
		echo "redis-server: $(redis-server --version 2>/dev/null | cut -d' ' -f3 || echo none)"
		echo "library: commit $(git -C .. rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C .. status --porcelain 2>/dev/null | grep -v ' bench/' | grep -qv ' BENCHMARKS.md' && echo ' plus uncommitted changes')"
		echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
		echo "runs: COUNT=$COUNT, -benchtime $BENCHTIME (heap: 1x; NewKeyGrowing, LRUInsertGrowing: 1000000x), -benchmem"
	} >"$OUT/machine.txt"
	cat "$OUT/machine.txt"

	"$bin" -test.run '^TestMeta$' -meta-out "$OUT/meta.json" >/dev/null

	bench() { # bench FILE PATTERN BENCHTIME
		"$bin" -test.run '^$' -test.bench "$2" -test.benchtime "$3" -test.benchmem -test.count 1 | tee -a "$OUT/raw-$1.txt" | grep -E '^(Benchmark|FAIL|---|panic)' || true
	}

	for i in $(seq "$COUNT"); do
		echo "== round $i of $COUNT"
		bench inmemory '^Benchmark(HotKey|HotKeyParallel|Keys100kParallel|NewKey)$' "$BENCHTIME"
		bench middleware '^BenchmarkMiddleware(Parallel|Parts|PartsParallel)?$' "$BENCHTIME"
		bench redis '^BenchmarkRedis(HotKeyParallel64|Keys100kParallel64|ScriptOp)?$' "$BENCHTIME"
		bench heap '^BenchmarkHeapPerKey(UsedAgain)?$' 1x
		bench growing '^Benchmark(NewKeyGrowing|LRUInsertGrowing)$' 1000000x
		bench layout '^BenchmarkLRU(Layout|LayoutWarm|Insert)$' "$BENCHTIME"
	done

	: >"$OUT/benchstat.txt"
	for f in "$OUT"/raw-*.txt; do
		echo "### $(basename "$f")" >>"$OUT/benchstat.txt"
		go run "$BENCHSTAT" "$f" >>"$OUT/benchstat.txt"
		echo >>"$OUT/benchstat.txt"
	done
fi

if [ "$MODE" != report ] && [ "${PROFILES:-1}" != 0 ]; then
	echo "== profiles"
	prof() { # prof NAME PATTERN BENCHTIME KIND(cpu|mem) [pprof flags]
		local name=$1 pat=$2 bt=$3 kind=$4
		shift 4
		"$bin" -test.run '^$' -test.bench "$pat" -test.benchtime "$bt" -test.benchmem \
			"-test.${kind}profile" "$tmp/$name.pprof" >/dev/null
		go tool pprof -top -nodecount 30 "$@" "$bin" "$tmp/$name.pprof" >"$OUT/profiles/$name.txt" 2>/dev/null
		if [ "$kind" = cpu ]; then
			echo "---- by cumulative time" >>"$OUT/profiles/$name.txt"
			go tool pprof -top -cum -nodecount 40 "$bin" "$tmp/$name.pprof" 2>/dev/null | sed -n '/flat%/,$p' >>"$OUT/profiles/$name.txt"
		fi
	}
	prof hotkey-cpu 'HotKey$/^ratelimit$' 2s cpu
	prof keys100k-cpu 'Keys100kParallel$/^ratelimit$' 2s cpu
	prof newkey-cpu 'NewKey$/^ratelimit$' 1000000x cpu
	prof newkey-alloc 'NewKey$/^ratelimit$' 1000000x mem -sample_index=alloc_space
	prof newkeygrowing-cpu 'NewKeyGrowing$/^ratelimit$' 1000000x cpu
	"$bin" -test.run '^$' -test.bench 'HeapPerKey$/^ratelimit$' -test.benchtime 1x -heap-profile "$tmp/heap-inuse.pprof" >/dev/null
	go tool pprof -top -nodecount 30 -sample_index=inuse_space "$bin" "$tmp/heap-inuse.pprof" >"$OUT/profiles/heap-inuse.txt" 2>/dev/null
	prof middleware-cpu 'Middleware$/^ratelimit$' 2s cpu
	prof middleware-alloc 'Middleware$/^ratelimit$' 2s mem -sample_index=alloc_space
	prof middleware-sethvargo-cpu 'Middleware$/^sethvargo$' 2s cpu
	if command -v redis-server >/dev/null; then
		prof redis-cpu 'Redis$/^ratelimit$' 2s cpu
		prof redis64-cpu 'RedisKeys100kParallel64$/^ratelimit$' 2s cpu
		prof redis64-redis_rate-cpu 'RedisKeys100kParallel64$/^redis_rate$' 2s cpu
		prof redis64-fixedwindow-cpu 'RedisKeys100kParallel64$/^ratelimit-fixedwindow$' 2s cpu
		prof redis64-ulule-cpu 'RedisKeys100kParallel64$/^ulule$' 2s cpu
		prof redis-alloc 'Redis$/^ratelimit$' 2s mem -sample_index=alloc_objects
		prof redis-redis_rate-alloc 'Redis$/^redis_rate$' 2s mem -sample_index=alloc_objects
	fi
fi

go run ./cmd/chart -results "$OUT" -md ../BENCHMARKS.md -svg "$OUT/chart.svg" -glance "$OUT/targets.svg"
echo "wrote $OUT/raw-*.txt, $OUT/benchstat.txt, $OUT/profiles/, $OUT/chart.svg, $OUT/targets.svg and ../BENCHMARKS.md"
