#!/usr/bin/env bash
# Installs the real peers the test suite drives: dig (DNS tests), curl (the
# README demo), wg, ip, iptables and iperf3 (mesh tests: NAT namespaces, a
# key rotation under load), ping, wrk (load during a redeploy),
# podman with runc (the container driver's engine: internal/podmantest
# starts its Docker-compatible service with the configuration these
# machines need), and Pebble (the ACME test server). Safe to run again.
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
command -v iptables >/dev/null || need+=(iptables)
command -v iperf3 >/dev/null || need+=(iperf3)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "installing ${need[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	else
		echo "warning: missing ${need[*]} (install them as root; tests that need them skip and say so)" >&2
	fi
fi
if [ ! -x internal/pebbletest/bin/pebble ]; then
	internal/pebbletest/install.sh >/dev/null
fi
echo "test dependencies ready"
