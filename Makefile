# Every Go module of the repository: the root module (the net/http middleware
# and core), one per adapter, the examples that need an adapter, and bench.
MODULES := $(shell find . -name go.mod -not -path './.git/*' -exec dirname {} \; | sort)

.PHONY: test check demo

# The whole test suite: every module's tests, with the race detector, each
# module on its own go.mod (no workspace), as CI runs it.
test:
	@set -e; for m in $(MODULES); do \
		echo "--- go test -race ./... in $$m"; \
		(cd $$m && GOWORK=off go test -race ./...); \
	done

# What CI checks before the tests: formatting, go vet (including its
# stdversion check against each module's go line) and tidy go.mod files.
check:
	@test -z "$$(gofmt -l .)" || { echo "gofmt -l lists files to format:"; gofmt -l .; exit 1; }
	@set -e; for m in $(MODULES); do \
		echo "--- go vet and go mod tidy -diff in $$m"; \
		(cd $$m && GOWORK=off go vet ./... && GOWORK=off go mod tidy -diff); \
	done

# The self-checking demo.
demo:
	go run ./examples/demo
