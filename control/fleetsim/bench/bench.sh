#!/usr/bin/env bash
# The fleet load of the README's benchmarks against real processes: storage nodes (`control
# server --status-flush 0`, credentials required), one control server
# without storage that writes the fleet status (the aggregator's process),
# and fleetsim, whose agents and gateways each connect with their own
# role's credentials. The processes' memory is read from /proc at the end.
#
#   control/fleetsim/bench/bench.sh [--nodes 3] [--tls on|off] [--sync always|DURATION] [fleetsim flags...]
#
# Defaults are the goals table's: 10,000 machines, 1,000 deployments,
# 10,000 writes/s for 60 s, 100 gateways, 5 applies before and 5 during.
# With --nodes 3 the storage nodes form a JetStream cluster (replicas 3)
# and the one leading the instances bucket, which the writes go to, is
# killed (SIGKILL) halfway through the writes. With
# --tls off the auth dir holds no fleet CA, so every connection and route
# is plaintext (the baseline of what TLS costs; default on). --sync is the
# storage nodes' sync policy (`control server --sync`; default always): an
# interval such as 2m is the baseline of what syncing every write costs.
set -euo pipefail
cd "$(dirname "$0")/../../.."
nodes=1 tls=on sync=always
while [ $# -gt 0 ]; do
	case "$1" in
	--nodes) nodes=$2; shift 2 ;;
	--tls) tls=$2; shift 2 ;;
	--sync) sync=$2; shift 2 ;;
	*) break ;;
	esac
done
case "$tls" in on | off) ;; *) echo "--tls $tls: want on or off" >&2; exit 2 ;; esac
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[ -n "${KEEP:-}" ] && { echo "kept $work" >&2; return; }
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/control" ./control
go build -o "$work/fleetsim" ./control/fleetsim/cmd/fleetsim
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Every simulated connection is a file on a server's side and on
# fleetsim's.
ulimit -n "$(ulimit -Hn)"

urls=() routes=()
for i in $(seq "$nodes"); do
	urls+=("nats://127.0.0.1:$(freeport)")
	routes+=("127.0.0.1:$(freeport)")
done
nats=$(IFS=,; echo "${urls[*]}")
node_pids=()
start_node() {
	local i=$1 args=()
	if [ "$nodes" -gt 1 ]; then
		args=(--name "s$i" --cluster-name edge --cluster-listen "${routes[$((i - 1))]}" --routes "$(IFS=,; echo "${routes[*]}")")
	fi
	"$work/control" server --data "$work/s$i" --listen "${urls[$((i - 1))]#nats://}" --auth on --auth-dir "$work/auth" \
		--tls "$tls" --sync "$sync" --stun-listen "" --status-flush 0 --log-level warn "${args[@]}" >"$work/s$i.out" 2>&1 &
	pids+=($!)
	node_pids+=($!)
}
start_node 1
# The first node creates the auth dir the others share.
for _ in $(seq 100); do [ -f "$work/auth/signing-root.nk" ] && break; sleep 0.2; done
if [ "$tls" = off ]; then
	# Without the fleet CA in the auth dir, credentials issued from it
	# carry none, so every client speaks plaintext too.
	for _ in $(seq 100); do [ -f "$work/auth/tls/ca.crt" ] && break; sleep 0.2; done
	rm -rf "$work/auth/tls"
fi
for i in $(seq 2 "$nodes"); do start_node "$i"; done
"$work/control" creds issue --role control --auth-dir "$work/auth" -o "$work/control.creds" >/dev/null
ready=
for _ in $(seq 300); do
	if "$work/control" machine ls --nats "$nats" --creds "$work/control.creds" >/dev/null 2>&1; then
		ready=1
		break
	fi
	sleep 0.2
done
[ -n "$ready" ] || { echo "storage not ready after 60s" >&2; cat "$work"/s*.out >&2; exit 1; }

# The control plane without storage: the fleet status writer.
"$work/control" server --storage=false --nats "$nats" --creds "$work/control.creds" --data "$work/cp" --auth-dir "$work/auth" \
	--stun-listen "" --log-level warn >"$work/cp.out" 2>&1 &
pids+=($!)
control_pid=$!
for _ in $(seq 300); do grep -q "control server ready" "$work/cp.out" && break; sleep 0.2; done
grep -q "control server ready" "$work/cp.out" || { echo "control server not ready after 60s" >&2; cat "$work/cp.out" >&2; exit 1; }

watch="control-server=$control_pid"
for i in $(seq "$nodes"); do watch+=",storage-node-s$i=${node_pids[$((i - 1))]}"; done
kill_args=()
if [ "$nodes" -gt 1 ]; then
	leaders=
	for i in $(seq "$nodes"); do leaders+="${leaders:+,}s$i=${node_pids[$((i - 1))]}"; done
	kill_args=(--midway-kill-leader "$leaders")
fi
status=0
"$work/fleetsim" --nats "$nats" --creds "$work/control.creds" --auth-dir "$work/auth" \
	--signing-key "$work/cp/signer.nk" \
	--machines 10000 --namespaces 1000 --rate 10000 --duration 60s --gateways 100 --applies 5 \
	--watch "$watch" "${kill_args[@]}" "$@" || status=$?
if [ "$status" -ne 0 ]; then
	for f in "$work"/*.out; do echo "== $f" >&2; tail -5 "$f" >&2; done
fi
exit "$status"
