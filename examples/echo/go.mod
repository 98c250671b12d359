module github.com/limitry/ratelimit/examples/echo

go 1.24

require (
	github.com/labstack/echo/v4 v4.13.4
	github.com/limitry/ratelimit v0.0.0-00010101000000-000000000000
	github.com/limitry/ratelimit/adapters/echolimit v0.0.0-00010101000000-000000000000
	github.com/limitry/ratelimit/adapters/promlimit v0.0.0-00010101000000-000000000000
	github.com/prometheus/client_golang v1.22.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/labstack/gommon v0.4.2 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.1 // indirect
	github.com/prometheus/common v0.62.0 // indirect
	github.com/prometheus/procfs v0.15.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/valyala/fasttemplate v1.2.2 // indirect
	golang.org/x/crypto v0.38.0 // indirect
	golang.org/x/net v0.40.0 // indirect
	golang.org/x/sys v0.33.0 // indirect
	golang.org/x/text v0.25.0 // indirect
	golang.org/x/time v0.11.0 // indirect
	google.golang.org/protobuf v1.36.5 // indirect
)

replace github.com/limitry/ratelimit => ../..

replace github.com/limitry/ratelimit/adapters/echolimit => ../../adapters/echolimit

replace github.com/limitry/ratelimit/adapters/promlimit => ../../adapters/promlimit
