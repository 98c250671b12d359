module github.com/limitry/ratelimit/adapters/redisstore

go 1.24

require (
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/limitry/ratelimit v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.19.0
	github.com/sony/gobreaker/v2 v2.4.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
)

replace github.com/limitry/ratelimit => ../..
