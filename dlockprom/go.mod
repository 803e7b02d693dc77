module github.com/dlockio/dlock/dlockprom

go 1.26.0

require github.com/dlockio/dlock v0.0.0-00010101000000-000000000000

require (
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_golang v1.23.2
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.66.1 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/sys v0.49.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)

// The adapter is developed in the dlock repository beside the library: the
// repository's go.work joins them, and this replacement lets the module be tidied
// and tested on its own.
replace github.com/dlockio/dlock => ../
