#!/usr/bin/env bash
# How long the mesh stops carrying packets while one node's meshd is
# replaced by a new binary, as a fleet upgrade does it (SIGTERM, then the
# new binary starts from the same data dir): ping every 20 ms from node A to
# node B's mesh IP across the restart of B's meshd, and report the packets
# lost and the longest silence. Two namespaces over a veth, meshd in TUN
# mode, the meshdev control plane; nothing leaves the machine.
#
# Needs root, iproute2, ping, Go.
# Usage: sudo meshd/bench/upgrade-gap.sh     (RUNS=3 restarts, one per run)
set -euo pipefail
umask 077

RUNS=${RUNS:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
ID=$$
A=mugA$ID
B=mugB$ID
NET=10.224.0
PIDS=()
. "$(dirname "$0")/pair.sh"

cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	pkill -f "$TMP/meshd" 2>/dev/null || true
	wait 2>/dev/null || true
	ip netns del "$A" 2>/dev/null || true
	ip netns del "$B" 2>/dev/null || true
	rm -rf "$TMP"
}
trap cleanup EXIT

for b in ip ping go; do
	command -v "$b" >/dev/null || { echo "upgrade-gap: needs $b" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "upgrade-gap: needs root" >&2; exit 1; }

echo "building meshd (two versions) and meshdev..." >&2
(cd "$ROOT" && go build -o "$TMP/" ./meshd/cmd/meshdev &&
	go build -ldflags "-X github.com/edgeplane/edgeplane/internal/version.Version=1.0.0" -o "$TMP/meshd" ./meshd &&
	go build -ldflags "-X github.com/edgeplane/edgeplane/internal/version.Version=1.1.0" -o "$TMP/meshd-next" ./meshd)

pair_netns
mesh_join gap
run_meshd() { # side binary
	local ns=${!1}
	ip netns exec "$ns" "$2" run --data "$TMP/$1" --log-level warn --pidfile "$TMP/$1.pid" >>"$TMP/meshd-$1.log" 2>&1 &
	PIDS+=($!)
}
run_meshd A "$TMP/meshd"
run_meshd B "$TMP/meshd"
MESHB=$(sed -n 's/.*"mesh_ip": "\([0-9.]*\)".*/\1/p' "$TMP/B/state.json")
for _ in $(seq 200); do ip netns exec "$A" ping -c1 -W1 "$MESHB" >/dev/null 2>&1 && break; sleep 0.1; done
ip netns exec "$A" ping -c1 -W1 "$MESHB" >/dev/null || { echo "upgrade-gap: no tunnel to $MESHB" >&2; exit 1; }

bin=$TMP/meshd-next
for run in $(seq "$RUNS"); do
	# 6 s of pings every 20 ms; B's meshd is replaced after 2 s.
	ip netns exec "$A" ping -i 0.02 -W 1 -w 6 -D "$MESHB" >"$TMP/ping-$run.log" 2>&1 &
	PING=$!
	sleep 2
	kill -TERM "$(cat "$TMP/B.pid")"
	while [ -e "$TMP/B.pid" ]; do sleep 0.01; done
	run_meshd B "$bin"
	wait "$PING" || true
	awk -v run="$run" -v bin="$(basename "$bin")" '
		/icmp_seq=/ {
			match($0, /icmp_seq=[0-9]+/); seq = substr($0, RSTART + 9, RLENGTH - 9) + 0
			if (last && seq - last - 1 > gap) gap = seq - last - 1
			last = seq; got++
		}
		/packets transmitted/ { sent = $1 }
		END {
			printf "run %d (restart onto %s): %d sent, %d lost, longest silence %d ms\n", run, bin, sent, sent - got, (gap + 1) * 20
		}' "$TMP/ping-$run.log"
	if [ "$bin" = "$TMP/meshd-next" ]; then bin=$TMP/meshd; else bin=$TMP/meshd-next; fi
done
