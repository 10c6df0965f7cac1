#!/bin/sh
# Installs the Pebble ACME test server the certs end-to-end test runs.
# Usage: certs/testdata/pebble/install.sh [bindir]   (default: this dir/bin)
# The test finds it at $PEBBLE_BIN, then certs/testdata/pebble/bin/pebble,
# and otherwise builds it itself with `go build` (pebble is in go.mod).
set -eu
dir=$(cd "$(dirname "$0")" && pwd)
bindir=${1:-$dir/bin}
mkdir -p "$bindir"
GOBIN=$bindir go install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.1
echo "pebble installed: $bindir/pebble (export PEBBLE_BIN=$bindir/pebble)"
