module github.com/limitry/ratelimit/examples/redis

go 1.24

require (
	github.com/limitry/ratelimit v0.0.0-00010101000000-000000000000
	github.com/limitry/ratelimit/adapters/redisstore v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.19.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
)

replace github.com/limitry/ratelimit => ../..

replace github.com/limitry/ratelimit/adapters/redisstore => ../../adapters/redisstore
