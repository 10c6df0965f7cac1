#!/bin/sh
# The edgeplane system user owns the state of the services that do not run
# as root (control server, gateway, meshd).
set -e
if [ "$1" = "configure" ]; then
	if ! getent passwd edgeplane >/dev/null; then
		adduser --system --group --home /var/lib/edgeplane --no-create-home \
			--gecos "edgeplane services" edgeplane >/dev/null
	fi
	install -d -m 0755 /var/lib/edgeplane
	# The services running as edgeplane read their config themselves.
	for f in /etc/edgeplane/*.json; do
		if [ -e "$f" ]; then chgrp edgeplane "$f"; fi
	done
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload >/dev/null || true
	fi
fi
exit 0
