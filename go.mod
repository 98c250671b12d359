module github.com/limitry/ratelimit

go 1.24

require (
	github.com/hashicorp/golang-lru/v2 v2.0.7
	go.uber.org/goleak v1.3.0
)
