#!/usr/bin/env bash
# iperf3 TCP throughput on one namespace pair, in one run:
#   raw veth (the physical limit)  vs  reference wireguard-go  vs  meshd (TUN)
# and the ratios meshd/wireguard-go (goal >= 1.0: STUN demux costs nothing)
# and meshd/raw.
#
# Needs root, iproute2, iperf3, wireguard-tools (wg), ping, Go.
# Usage: sudo meshd/bench/bench.sh            (DUR=seconds per run, default 10)
set -euo pipefail
umask 077

DUR=${DUR:-10}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WGREF_VERSION=v0.0.0-20260522210424-ecfc5a8d5446
TMP=$(mktemp -d)
ID=$$
A=mdbA$ID
B=mdbB$ID
NET=10.223.0
PIDS=()
. "$(dirname "$0")/pair.sh"

cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	ip netns del "$A" 2>/dev/null || true
	ip netns del "$B" 2>/dev/null || true
	rm -rf "$TMP"
}
trap cleanup EXIT

for b in ip iperf3 wg ping go; do
	command -v "$b" >/dev/null || { echo "bench: needs $b" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "bench: needs root" >&2; exit 1; }

echo "building meshd, meshdev and the reference wireguard-go..." >&2
(cd "$ROOT" && go build -o "$TMP/" ./meshd ./meshd/cmd/meshdev)
WGREF=$(command -v wireguard-go || command -v wireguard || true)
if [ -z "$WGREF" ]; then
	(cd "$TMP" && GOBIN="$TMP" GOFLAGS=-mod=mod go install "golang.zx2c4.com/wireguard@$WGREF_VERSION")
	WGREF=$TMP/wireguard
fi

pair_netns

ip netns exec "$B" iperf3 -s >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do ip netns exec "$B" ss -ltn | grep -q ':5201 ' && break; sleep 0.1; done

wait_ping() { # ns ip
	for _ in $(seq 100); do ip netns exec "$1" ping -c1 -W1 "$2" >/dev/null 2>&1 && return 0; sleep 0.1; done
	echo "bench: no ping $2 from $1" >&2; return 1
}

mbps() { # ns target -> receiver Mbit/s
	wait_ping "$1" "$2"
	ip netns exec "$1" iperf3 -c "$2" -t "$DUR" -f m | awk '/receiver/ {print $(NF-2)}'
}

echo "raw veth..." >&2
RAW=$(mbps "$A" 10.223.0.2)

echo "reference wireguard-go..." >&2
for side in A B; do
	ns=${!side}
	ip netns exec "$ns" wg genkey >"$TMP/$side.key"
	wg pubkey <"$TMP/$side.key" >"$TMP/$side.pub"
	WG_PROCESS_FOREGROUND=1 ip netns exec "$ns" "$WGREF" "wgr$side$ID" >"$TMP/wgref-$side.log" 2>&1 &
	PIDS+=($!)
done
for _ in $(seq 50); do
	ip netns exec "$A" wg show "wgrA$ID" >/dev/null 2>&1 && ip netns exec "$B" wg show "wgrB$ID" >/dev/null 2>&1 && break
	sleep 0.1
done
ip netns exec "$A" wg set "wgrA$ID" private-key "$TMP/A.key" listen-port 51900 peer "$(cat "$TMP/B.pub")" endpoint 10.223.0.2:51900 allowed-ips 10.101.0.2/32
ip netns exec "$B" wg set "wgrB$ID" private-key "$TMP/B.key" listen-port 51900 peer "$(cat "$TMP/A.pub")" endpoint 10.223.0.1:51900 allowed-ips 10.101.0.1/32
ip -n "$A" addr add 10.101.0.1/24 dev "wgrA$ID"
ip -n "$B" addr add 10.101.0.2/24 dev "wgrB$ID"
ip -n "$A" link set "wgrA$ID" mtu 1420 up
ip -n "$B" link set "wgrB$ID" mtu 1420 up
REF=$(mbps "$A" 10.101.0.2)
ip -n "$A" link del "wgrA$ID" 2>/dev/null || true
ip -n "$B" link del "wgrB$ID" 2>/dev/null || true

echo "meshd..." >&2
mesh_join bench
for side in A B; do
	ns=${!side}
	ip netns exec "$ns" "$TMP/meshd" run --data "$TMP/$side" --log-level warn >"$TMP/meshd-$side.log" 2>&1 &
	PIDS+=($!)
done
MESHB=$(sed -n 's/.*"mesh_ip": "\([0-9.]*\)".*/\1/p' "$TMP/B/state.json")
MESH=$(mbps "$A" "$MESHB")

awk -v raw="$RAW" -v ref="$REF" -v mesh="$MESH" -v dur="$DUR" 'BEGIN {
	printf "iperf3 TCP, %ss each, one namespace pair over veth (Mbit/s, receiver)\n", dur
	printf "  raw veth            %10.0f\n", raw
	printf "  wireguard-go (ref)  %10.0f\n", ref
	printf "  meshd (tun)         %10.0f\n", mesh
	printf "  meshd / wireguard-go  %.2fx   (goal >= 1.0)\n", mesh / ref
	printf "  meshd / raw veth      %.2fx\n", mesh / raw
}'
