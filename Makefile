# edgeplane — the two commands of the README:
#   make up     start the whole appliance on this box (embedded NATS) and show
#               the sample app answering through the gateway
#   make test   run every test (needs root for the network-namespace tests)

GO       ?= go
BIN      ?= bin
TEST_TIMEOUT ?= 30m

.PHONY: up down build test vet fmt bench bench-apply bench-gateway bench-dns bench-mesh deps-test

build:
	mkdir -p $(BIN)
	$(GO) build -o $(BIN)/control ./control
	$(GO) build -o $(BIN)/caddy ./caddymodule/cmd/caddy
	$(GO) build -o $(BIN)/meshd ./meshd
	$(GO) build -o $(BIN)/edgeplane-dns ./dnsproj/cmd/edgeplane-dns
	$(GO) build -o $(BIN)/hello ./examples/hello

up: build
	scripts/up.sh

down:
	scripts/up.sh --down

# Installs what the tests drive as real peers (dig, wg, ping, ip, Pebble).
deps-test:
	scripts/test-deps.sh

test: deps-test
	$(GO) vet ./...
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: files above need formatting" && exit 1)
	$(GO) test -timeout $(TEST_TIMEOUT) ./...

vet:
	$(GO) vet ./...

fmt:
	gofmt -w .

bench-apply:
	$(GO) test -run '^$$' -bench Apply -benchtime 10x ./control/deploy/

bench-gateway:
	$(GO) test -run '^$$' -bench . ./caddymodule/ ./projection/

bench-dns:
	dnsproj/bench/bench.sh

bench-mesh:
	meshd/bench/bench.sh

bench: bench-apply bench-gateway
