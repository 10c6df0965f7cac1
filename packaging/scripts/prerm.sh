#!/bin/sh
# Stop this package's services before its files go (remove, or an upgrade
# that replaces them: the new package's postinst does not start them, the
# operator or the fleet upgrade does).
set -e
if [ -d /run/systemd/system ] && [ "$1" = "remove" ]; then
	for unit in @UNITS@; do
		systemctl stop "$unit" >/dev/null 2>&1 || true
		systemctl disable "$unit" >/dev/null 2>&1 || true
	done
fi
exit 0
