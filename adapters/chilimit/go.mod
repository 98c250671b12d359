module github.com/limitry/ratelimit/adapters/chilimit

go 1.24

require (
	github.com/go-chi/chi/v5 v5.5.0
	github.com/limitry/ratelimit v0.0.0-00010101000000-000000000000
)

require github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect

replace github.com/limitry/ratelimit => ../..
