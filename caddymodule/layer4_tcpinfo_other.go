//go:build !linux

package caddymodule

import "net"

// bytesReceived is unknown here: a spliced connection's bytes are counted
// when it ends.
func bytesReceived(*net.TCPConn) (uint64, bool) { return 0, false }
