#!/usr/bin/env bash
# Installs the real peers the test suite drives: dig (DNS tests), curl (the
# README demo), wg, ip, iptables and iperf3 (mesh tests: NAT namespaces, a
# key rotation under load), ping, wrk (load during a redeploy), tcpdump
# (a capture of what crosses the wire to a storage node),
# the container driver's engines (podman with runc, and Docker's dockerd
# from docker.io: internal/enginetest starts each on a socket of its own
# with its own storage), docker-registry (a registry on loopback for
# pull-by-digest tests), chromium (the dashboard's tests drive it
# headless), Pebble (the ACME test server), and Debian's redis-server with
# redis-cli and redis-benchmark (the layer-4 tests and bench-l4 deploy it
# as a process service behind a gateway's TCP port). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v dig >/dev/null || need+=(dnsutils)
command -v curl >/dev/null || need+=(curl)
command -v wg >/dev/null || need+=(wireguard-tools)
command -v ping >/dev/null || need+=(iputils-ping)
command -v ip >/dev/null || need+=(iproute2)
command -v wrk >/dev/null || need+=(wrk)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v iptables >/dev/null || need+=(iptables)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v chromium >/dev/null || need+=(chromium)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "installing ${need[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
		# The tests start engines and registries of their own; the system
		# services these packages bring (a dockerd adding a bridge and
		# iptables rules, a registry on :5000, a redis on :6379) would only
		# get in the way.
		if [ -d /run/systemd/system ] && [[ " ${need[*]} " =~ " docker.io "|" docker-registry "|" redis-server " ]]; then
			systemctl disable --now docker.service docker.socket docker-registry.service redis-server.service >/dev/null 2>&1 || true
		fi
	else
		echo "warning: missing ${need[*]} (install them as root; tests that need them skip and say so)" >&2
	fi
fi
if [ ! -x internal/pebbletest/bin/pebble ]; then
	internal/pebbletest/install.sh >/dev/null
fi
echo "test dependencies ready"
