# Sourced by meshd's bench scripts. Two network namespaces $A and $B joined
# by a veth ($NET.1 in A, $NET.2 in B), and the meshdev control plane in A
# with one meshd node joined in each namespace. The caller sets TMP (holding
# the built meshdev and meshd), ID, A, B, NET and the PIDS array its cleanup
# kills.

pair_netns() {
	ip netns add "$A"
	ip netns add "$B"
	ip link add "va$ID" netns "$A" type veth peer name "vb$ID" netns "$B"
	ip -n "$A" addr add "$NET.1/24" dev "va$ID"
	ip -n "$B" addr add "$NET.2/24" dev "vb$ID"
	for n in "$A" "$B"; do ip -n "$n" link set lo up; done
	ip -n "$A" link set "va$ID" up
	ip -n "$B" link set "vb$ID" up
}

# mesh_join NAME: starts meshdev in A and joins machines NAMEA and NAMEB
# (data in $TMP/A and $TMP/B, WireGuard port 51820). meshdev's NATS
# listens beyond loopback, so each node gets mesh credentials for its
# machine. Failures name NAME.
mesh_join() {
	coproc CTL { ip netns exec "$A" "$TMP/meshdev" --data "$TMP/ctl" --host "$NET.1" 2>"$TMP/meshdev.log"; }
	PIDS+=($CTL_PID)
	local ready kind creds tok side ns
	read -r ready <&"${CTL[0]}"
	case $ready in READY*) ;; *) echo "$1: meshdev failed: $(cat "$TMP/meshdev.log")" >&2; exit 1;; esac
	for side in A B; do
		ns=${!side}
		echo "creds $1$side $TMP/$side.creds" >&"${CTL[1]}"
		read -r kind creds <&"${CTL[0]}"
		[ "$kind" = CREDS ] || { echo "$1: meshdev creds: $kind $creds" >&2; exit 1; }
		echo invite >&"${CTL[1]}"
		read -r _ tok <&"${CTL[0]}"
		ip netns exec "$ns" "$TMP/meshd" join --token "$tok" --data "$TMP/$side" --nats "nats://$NET.1:4222" \
			--creds "$creds" --machine "$1$side" --listen-port 51820 >/dev/null
	done
}
