#!/usr/bin/env bash
# Issue 15's fleet load against a real `control server` process (embedded
# storage node, credentials required): fleetsim's agents and gateways each
# connect with their own role's credentials; the control server's memory
# (the aggregator's process) is read from /proc at the end.
#
#   internal/fleetsim/bench/bench.sh [fleetsim flags...]
#
# Defaults are the goals table's: 10,000 machines, 1,000 deployments,
# 10,000 writes/s for 60 s, 100 gateways, 5 applies before and during.
set -euo pipefail
cd "$(dirname "$0")/../../.."
work=$(mktemp -d)
server_pid=
cleanup() {
	[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/control" ./control
go build -o "$work/fleetsim" ./internal/fleetsim/cmd/fleetsim
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Each simulated connection is one file on the server's side.
ulimit -n "$(ulimit -Hn)"
"$work/control" server --data "$work/server" --listen "127.0.0.1:$port" --auth on --stun-listen "" \
	--log-level warn 2>"$work/server.log" &
server_pid=$!
# Ready once the store answers the control credentials it wrote.
ready=
for _ in $(seq 150); do
	if "$work/control" machine ls --nats "nats://127.0.0.1:$port" --creds "$work/server/control.creds" >/dev/null 2>&1; then
		ready=1
		break
	fi
	kill -0 "$server_pid" || { cat "$work/server.log" >&2; exit 1; }
	sleep 0.2
done
[ -n "$ready" ] || { echo "control server not ready after 30s" >&2; cat "$work/server.log" >&2; exit 1; }
"$work/fleetsim" --nats "nats://127.0.0.1:$port" --creds "$work/server/control.creds" --auth-dir "$work/server/auth" \
	--signing-key "$work/server/signer.nk" \
	--machines 10000 --namespaces 1000 --rate 10000 --duration 60s --gateways 100 --applies 5 \
	--server-pid "$server_pid" "$@"
