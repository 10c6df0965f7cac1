# edgeplane — the two commands of the README:
#   make up     start the whole appliance on this box (embedded NATS) and show
#               the sample app answering through the gateway
#   make test   run every test (needs root for the network-namespace tests),
#               the packages with concurrency of their own under -race

GO       ?= go
BIN      ?= bin
DIST     ?= dist
# VERSION is what the binaries report (control version, meshd version, the
# agent's heartbeat) and the packages' version: make build VERSION=1.4.0.
VERSION  ?= 0.0.0-dev
LDFLAGS  := -X github.com/edgeplane/edgeplane/internal/version.Version=$(VERSION)
TEST_TIMEOUT ?= 30m

.PHONY: up down build package release-tag image test vet fmt bench bench-apply bench-gateway bench-dns bench-mesh bench-mesh-upgrade bench-regions bench-l4 bench-gateway-vs deps-test

# ENGINE builds the example image: docker if it answers, else podman.
ENGINE ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)

build:
	mkdir -p $(BIN)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/control ./control
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/caddy ./caddymodule/cmd/caddy
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/meshd ./meshd
	$(GO) build -o $(BIN)/edgeplane-dns ./dnsproj/cmd/edgeplane-dns
	$(GO) build -o $(BIN)/hello ./examples/hello

# Debian packages of control, the gateway and meshd, with their systemd
# units, into $(DIST) (packaging/, README "Install on a box"). A release is
# tagged as it is packaged (see release-tag), first, so that a refused tag
# builds nothing; TAG=no packages without tagging (tests that package a
# throwaway version).
TAG ?= yes
package: $(if $(filter no,$(TAG)),,release-tag)
	$(MAKE) --no-print-directory build
	$(GO) run ./packaging/build --bin $(BIN) --out $(DIST) --version $(VERSION)

# make release-tag VERSION=0.39.0 (make package runs it first) tags HEAD
# v0.39.0, annotated, and records "v0.39.0 COMMIT" in RELEASES in a commit
# of its own: the skew tests build the previous release from there, by tag
# or by commit in a clone without tags. It refuses a dirty tree, a tag at
# another commit and a version older than the newest recorded; run again it
# does nothing; a development VERSION (the default 0.0.0-dev) is not tagged
# (scripts/release-tag.sh).
release-tag:
	scripts/release-tag.sh $(VERSION)

# The example app as an image (examples/hello-image.yaml runs it):
# localhost/edgeplane-hello:latest, FROM scratch with a static hello.
image:
	mkdir -p $(BIN)/image
	CGO_ENABLED=0 $(GO) build -o $(BIN)/image/hello ./examples/hello
	cp examples/hello/Containerfile $(BIN)/image/
	$(ENGINE) build -t localhost/edgeplane-hello:latest $(BIN)/image

up: build
	scripts/up.sh

down:
	scripts/up.sh --down

# Installs what the tests drive as real peers (dig, wg, ping, ip, wrk, podman,
# Docker, a registry, Pebble, redis-server).
deps-test:
	scripts/test-deps.sh

# Packages with goroutines of their own run their tests under the race
# detector (once: not again in the plain run).
MODULE    := github.com/edgeplane/edgeplane
RACE_PKGS ?= store projection caddymodule control/agent control/deploy control/fleet control/fleetsim \
             meshd/node meshd/wgbind meshd/relay meshd/registrar certs dnsproj

# The integration tests (real processes, clusters in network namespaces)
# and the power-cut tests (storage nodes on FUSE mounts, a cluster cut and
# rebooted) run on their own, after the rest, one package at a time:
# beside them on two cores, a storage node test's three-node cluster once
# took more than a minute to start.
SOLO_PKGS ?= integration integration/cuts

test: deps-test
	$(GO) vet ./...
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: files above need formatting" && exit 1)
	$(GO) test -race -timeout $(TEST_TIMEOUT) $(addprefix ./,$(RACE_PKGS))
	$(GO) test -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v -x $(foreach p,$(RACE_PKGS) $(SOLO_PKGS),-e '$(MODULE)/$(p)'))
	$(GO) test -p 1 -timeout $(TEST_TIMEOUT) $(addprefix ./,$(SOLO_PKGS))

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

# How long the mesh stops while one node's meshd is replaced (root).
bench-mesh-upgrade:
	meshd/bench/upgrade-gap.sh

# The issue 40 goals in the multi-region lab: locality's latency cost, a
# frozen region, region states applied everywhere (root).
bench-regions:
	scripts/bench-regions

# The issue 41 goals: layer 4 through a gateway vs direct (iperf3
# throughput, connection setup latency), failed commands across a
# redeploy under load, HTTP req/s with layer 4 loaded vs not.
bench-l4:
	scripts/bench-l4

# The issue 43 gateway goals with real processes: the gateway vs stock
# Caddy's reverse_proxy, nginx and a direct connection to the same
# instances, wrk rounds interleaved (root installs nginx-light if missing).
bench-gateway-vs:
	scripts/bench-gateway

bench: bench-apply bench-gateway
