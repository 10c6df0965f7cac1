#!/usr/bin/env bash
# Starts the whole edgeplane appliance on this box and shows the sample app
# answering through the gateway:
#   control server --agent   embedded NATS (127.0.0.1:4222), the control plane, this box's agent,
#                            the web dashboard on http://127.0.0.1:8090/
#   caddy (custom build)     gateway on :8080/:8443, admin on localhost:2019, DNS on 127.0.0.1:1053
#   examples/hello.yaml      deployed with `control deploy apply`
#
# Usage: scripts/up.sh          start, demo, then keep running until Ctrl-C
#        scripts/up.sh --once   start, demo, stop everything (used by the tests)
#        scripts/up.sh --down   stop what an earlier run left
# Everything it writes lives in $EDGEPLANE_DATA (default ./.data). The ports
# can be moved with UP_NATS_PORT, UP_HTTP_PORT, UP_HTTPS_PORT, UP_ADMIN_PORT,
# UP_DNS_PORT, UP_DASHBOARD_PORT and UP_STUN_PORT (it and the next one); BIN names the folder
# with the binaries (default ./bin, what `make build` fills).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DATA=${EDGEPLANE_DATA:-$ROOT/.data}
BIN=${BIN:-$ROOT/bin}
NATS_PORT=${UP_NATS_PORT:-4222}
HTTP_PORT=${UP_HTTP_PORT:-8080}
HTTPS_PORT=${UP_HTTPS_PORT:-8443}
ADMIN_PORT=${UP_ADMIN_PORT:-2019}
DNS_PORT=${UP_DNS_PORT:-1053}
STUN_PORT=${UP_STUN_PORT:-3478}
DASHBOARD_PORT=${UP_DASHBOARD_PORT:-8090}
export EDGEPLANE_NATS=nats://127.0.0.1:$NATS_PORT
# Deploys are signed: the CLI signs with the key control server keeps in its
# data dir (DATA/signer.nk).
export EDGEPLANE_SIGNING_KEY=$DATA/control/signer.nk
mode=${1:-}

log() { printf '\033[1m==> %s\033[0m\n' "$*"; }

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
	local deadline=$((SECONDS + $1)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		if [ $SECONDS -ge $deadline ]; then
			echo "timed out waiting for $what" >&2
			return 1
		fi
		sleep 0.2
	done
}

down() {
	if [ -f "$DATA/caddy.pid" ] || [ -f "$DATA/control.pid" ]; then
		# Remove the sample namespace first: instances outlive the control
		# plane by design, so they are stopped by a deploy, not by a kill.
		if [ -f "$DATA/control.pid" ] && kill -0 "$(cat "$DATA/control.pid")" 2>/dev/null; then
			"$BIN/control" deploy destroy demo --drain-grace 100ms >/dev/null 2>&1 || true
		fi
		local pids=()
		for p in caddy control; do
			if [ -f "$DATA/$p.pid" ]; then
				pids+=("$(cat "$DATA/$p.pid")")
				kill "${pids[-1]}" 2>/dev/null || true
				rm -f "$DATA/$p.pid"
			fi
		done
		# "stopped" means stopped: each writes its last state (the
		# gateway's routing snapshot, the store) as it exits.
		for pid in "${pids[@]}"; do
			for _ in $(seq 100); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
			kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
		done
		log "stopped"
	fi
}

if [ "$mode" = --down ]; then
	down
	exit 0
fi

for b in control caddy hello; do
	[ -x "$BIN/$b" ] || { echo "missing $BIN/$b: run 'make up' (it builds first)" >&2; exit 1; }
done
mkdir -p "$DATA"
down

log "starting control server with the local agent (data in $DATA/control)"
# The control server and the gateway get sessions of their own: Ctrl-C in
# the terminal reaches this script alone, whose exit trap removes the demo
# through the still running control plane and then stops both.
setsid "$BIN/control" server --data "$DATA/control" --agent --machine local --listen "127.0.0.1:$NATS_PORT" \
	--stun-listen "127.0.0.1:$STUN_PORT,127.0.0.1:$((STUN_PORT + 1))" --dashboard-listen "127.0.0.1:$DASHBOARD_PORT" >"$DATA/control.log" 2>&1 &
echo $! >"$DATA/control.pid"
wait_for 30 "control server" grep -q "control server ready" "$DATA/control.log" || { cat "$DATA/control.log"; exit 1; }

log "starting the gateway (custom Caddy) with caddy.json"
sed -e "s#/var/lib/edgeplane#$DATA#g" -e "s#127.0.0.1:4222#127.0.0.1:$NATS_PORT#g" \
	-e "s#:8080#:$HTTP_PORT#g; s#: 8080#: $HTTP_PORT#g; s#:8443#:$HTTPS_PORT#g; s#: 8443#: $HTTPS_PORT#g" \
	-e "s#localhost:2019#localhost:$ADMIN_PORT#g; s#127.0.0.1:1053#127.0.0.1:$DNS_PORT#g" caddy.json >"$DATA/caddy.json"
XDG_DATA_HOME="$DATA/caddy-data" XDG_CONFIG_HOME="$DATA/caddy-config" \
	setsid "$BIN/caddy" run --config "$DATA/caddy.json" >"$DATA/caddy.log" 2>&1 &
echo $! >"$DATA/caddy.pid"
wait_for 30 "the gateway's admin API" curl -fsS "http://localhost:$ADMIN_PORT/edgeplane/projection" || { cat "$DATA/caddy.log"; exit 1; }

log "deploying examples/hello.yaml"
sed "s#\./bin/hello#$BIN/hello#" examples/hello.yaml >"$DATA/hello.yaml"
"$BIN/control" deploy apply -f "$DATA/hello.yaml" --drain-grace 100ms

log "the sample app through the gateway: curl -H 'Host: hello.localhost' http://127.0.0.1:$HTTP_PORT/"
for _ in 1 2 3 4; do
	curl -fsS -H 'Host: hello.localhost' "http://127.0.0.1:$HTTP_PORT/"
done
if command -v dig >/dev/null; then
	log "DNS from the same projection: dig @127.0.0.1 -p $DNS_PORT hello.demo.edgeplane.internal"
	dig +short @127.0.0.1 -p "$DNS_PORT" hello.demo.edgeplane.internal A || echo "(DNS did not answer)"
fi
log "every layer agrees: control doctor --gateway http://localhost:$ADMIN_PORT --dns 127.0.0.1:$DNS_PORT"
"$BIN/control" doctor --gateway "http://localhost:$ADMIN_PORT" --dns "127.0.0.1:$DNS_PORT" || true
log "deploy more with EDGEPLANE_NATS=$EDGEPLANE_NATS EDGEPLANE_SIGNING_KEY=$EDGEPLANE_SIGNING_KEY $BIN/control deploy apply -f FILE"
log "inspect: $BIN/control deploy status | $BIN/control instances | $BIN/control machine ls | curl localhost:$ADMIN_PORT/edgeplane/routes"
curl -fsS -o /dev/null "http://127.0.0.1:$DASHBOARD_PORT/" && log "dashboard: http://127.0.0.1:$DASHBOARD_PORT/ (read-only; open on loopback)"

if [ "$mode" = --once ]; then
	down
	exit 0
fi
trap down EXIT INT TERM
log "running; Ctrl-C stops the appliance (logs in $DATA/*.log)"
wait
