#!/bin/sh
# Installs the Pebble ACME test server the end-to-end tests run.
# Usage: internal/pebbletest/install.sh [bindir]   (default: this dir/bin)
# The tests find it at $PEBBLE_BIN, then internal/pebbletest/bin/pebble,
# and otherwise build it themselves with `go build` (pebble is in go.mod).
set -eu
dir=$(cd "$(dirname "$0")" && pwd)
bindir=${1:-$dir/bin}
mkdir -p "$bindir"
GOBIN=$bindir go install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.1
echo "pebble installed: $bindir/pebble (export PEBBLE_BIN=$bindir/pebble)"
