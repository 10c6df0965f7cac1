#!/bin/sh
# Removing keeps the data (state dirs and /etc/edgeplane); purging removes
# this package's state, and the edgeplane user with the last package.
set -e
if [ "$1" = "purge" ]; then
	for dir in @STATE@; do
		rm -rf "/var/lib/edgeplane/$dir"
	done
	# The releases the root agent staged for the gateway and meshd go with
	# the last package.
	if [ -d /var/lib/edgeplane ] && [ "$(ls -A /var/lib/edgeplane)" = "releases" ]; then
		rm -rf /var/lib/edgeplane/releases
	fi
	if [ -d /var/lib/edgeplane ] && [ -z "$(ls -A /var/lib/edgeplane)" ]; then
		rmdir /var/lib/edgeplane
		rmdir /etc/edgeplane 2>/dev/null || true
		if getent passwd edgeplane >/dev/null; then
			deluser --system edgeplane >/dev/null 2>&1 || true
		fi
		if getent group edgeplane >/dev/null; then
			delgroup --system edgeplane >/dev/null 2>&1 || true
		fi
	fi
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
