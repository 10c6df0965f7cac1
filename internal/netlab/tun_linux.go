package netlab

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenTUN creates TUN device name (IFF_TUN|IFF_NO_PI: one bare IP packet
// per read and write) in the caller's network namespace and returns it;
// the device goes away when the file is closed and its owner exits. Its
// reads honour Close (the file is non-blocking, on Go's poller).
func OpenTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("naming TUN device %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("creating TUN device %q: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}
