package caddymodule

import (
	"net"

	"golang.org/x/sys/unix"
)

// bytesReceived is what the kernel has received on c (TCP_INFO).
func bytesReceived(c *net.TCPConn) (uint64, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	cerr := raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if cerr != nil || err != nil {
		return 0, false
	}
	return info.Bytes_received, true
}
