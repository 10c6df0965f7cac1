#!/usr/bin/env bash
# bench.sh: queries per second of edgeplane-dns (standalone, projection fed
# by a real embedded NATS) against CoreDNS v1.15.0 serving the same records
# (hosts plugin + fallthrough to a file zone with the SOA), measured with
# dnsperf in one run, rounds interleaved. Prints each run and the ratio.
#
#   dnsproj/bench/bench.sh                 # builds CoreDNS (~5.5 min cold)
#   COREDNS_BIN=/path/to/coredns dnsproj/bench/bench.sh
#
# Knobs (env): DURATION (s per run, 10), ROUNDS (2), CLIENTS (dnsperf -c, 4),
# OUTSTANDING (dnsperf -q, 100), SERVICES (100), INSTANCES (3),
# NX_PERCENT (10), OUR_PORT (15353), CORE_PORT (15354), PROM_PORT (19153).
# Needs: go, dnsperf and dig (Debian: apt-get install -y dnsperf dnsutils).
set -euo pipefail

cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-2}
CLIENTS=${CLIENTS:-4}
OUTSTANDING=${OUTSTANDING:-100}
SERVICES=${SERVICES:-100}
INSTANCES=${INSTANCES:-3}
NX_PERCENT=${NX_PERCENT:-10}
OUR_PORT=${OUR_PORT:-15353}
CORE_PORT=${CORE_PORT:-15354}
PROM_PORT=${PROM_PORT:-19153}
COREDNS_VERSION=v1.15.0
ZONE=edgeplane.internal.

for tool in go dnsperf dig; do
	if ! command -v "$tool" >/dev/null; then
		echo "bench: $tool is missing (Debian: apt-get update && apt-get install -y dnsperf dnsutils)" >&2
		exit 1
	fi
done

WORK=$(mktemp -d /tmp/edgeplane-dns-bench.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

if [[ -n "${COREDNS_BIN:-}" ]]; then
	coredns=$COREDNS_BIN
else
	echo "bench: building CoreDNS $COREDNS_VERSION from the module proxy (about 5.5 min cold)..."
	(cd "$WORK" && GOBIN="$WORK/bin" GOFLAGS=-mod=mod go install "github.com/coredns/coredns@$COREDNS_VERSION")
	coredns=$WORK/bin/coredns
fi
echo "bench: building edgeplane-dns and the seed helper..."
go build -o "$WORK/bin/edgeplane-dns" ./dnsproj/cmd/edgeplane-dns
go build -o "$WORK/bin/seed" ./dnsproj/bench/seed

"$WORK/bin/seed" --dir "$WORK" --services "$SERVICES" --instances "$INSTANCES" --nx-percent "$NX_PERCENT" --zone "$ZONE" &
pids+=($!)
for _ in $(seq 1 600); do [[ -s $WORK/nats.url ]] && break; sleep 0.1; done
[[ -s $WORK/nats.url ]] || { echo "bench: seed did not come up" >&2; exit 1; }

"$WORK/bin/edgeplane-dns" --nats "$(cat "$WORK/nats.url")" --listen "127.0.0.1:$OUR_PORT" --zone "$ZONE" --log-level warn &
pids+=($!)

cat >"$WORK/Corefile" <<EOF
$ZONE:$CORE_PORT {
	bind 127.0.0.1
	hosts $WORK/hosts $ZONE {
		ttl 5
		no_reverse
		fallthrough
	}
	file $WORK/zone.db $ZONE
	prometheus 127.0.0.1:$PROM_PORT
}
EOF
"$coredns" -conf "$WORK/Corefile" -quiet &
pids+=($!)

# Both must serve the same answers before anything is measured.
answer() { dig +tries=1 +time=1 +short @127.0.0.1 -p "$1" "$2" A | sort; }
status() { dig +tries=1 +time=1 @127.0.0.1 -p "$1" "$2" A | sed -n 's/.*status: \([A-Z]*\),.*/\1/p'; }
for port in "$OUR_PORT" "$CORE_PORT"; do
	for _ in $(seq 1 300); do
		[[ $(answer "$port" "svc0.bench.$ZONE" | wc -l) -eq $INSTANCES ]] && break
		sleep 0.1
	done
done
for name in svc0 svc1 "svc$((SERVICES - 1))"; do
	ours=$(answer "$OUR_PORT" "$name.bench.$ZONE")
	theirs=$(answer "$CORE_PORT" "$name.bench.$ZONE")
	if [[ -z $ours || $ours != "$theirs" ]]; then
		echo "bench: answers differ for $name: edgeplane-dns [$ours] coredns [$theirs]" >&2
		exit 1
	fi
done
for port in "$OUR_PORT" "$CORE_PORT"; do
	st=$(status "$port" "missing.bench.$ZONE")
	[[ $st == NXDOMAIN ]] || { echo "bench: port $port answers $st for a missing name" >&2; exit 1; }
done
echo "bench: both servers give the same answers ($SERVICES services x $INSTANCES A records, NXDOMAIN with SOA)"

declare -A sum=([edgeplane-dns]=0 [coredns]=0)
run() { # name port
	local out
	out=$(dnsperf -s 127.0.0.1 -p "$2" -d "$WORK/queries.txt" -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING" 2>&1)
	local qps lost codes
	qps=$(awk '/Queries per second:/ {print $4}' <<<"$out")
	lost=$(awk '/Queries lost:/ {print $3}' <<<"$out")
	codes=$(sed -n 's/^ *Response codes: *//p' <<<"$out")
	printf '%-14s round %d: %10.0f qps  lost %-6s %s\n' "$1" "$r" "$qps" "$lost" "$codes"
	sum[$1]=$(awk -v a="${sum[$1]}" -v b="$qps" 'BEGIN {print a + b}')
}
echo "bench: dnsperf -l $DURATION -c $CLIENTS -q $OUTSTANDING, $ROUNDS interleaved rounds, $(nproc) cores"
for r in $(seq 1 "$ROUNDS"); do
	run edgeplane-dns "$OUR_PORT"
	run coredns "$CORE_PORT"
done
awk -v a="${sum[edgeplane-dns]}" -v b="${sum[coredns]}" -v n="$ROUNDS" 'BEGIN {
	printf "mean qps: edgeplane-dns %.0f, coredns %.0f; ratio edgeplane-dns/coredns = %.2fx\n", a / n, b / n, a / b
}'
