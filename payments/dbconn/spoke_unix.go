//go:build unix

package dbconn

import (
	"crypto/tls"
	"net"
	"syscall"
)

// serverSpoke reports whether an idle connection's socket has anything to read — bytes the
// server sent unasked (a FATAL before it closed) or its end (EOF) — by one non-blocking peek,
// which leaves whatever it finds for the ping to read.
func serverSpoke(c net.Conn) bool {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn() // a TLS record waiting is the server speaking as well
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	spoke := false
	// Control, not Read: Read takes the socket's read lock, which pgx's background reader may
	// still hold on an idle connection (started by a write that stalled, stopped only once its
	// read returns): the peek then waited, deaf to every context, until the server spoke — never,
	// on an idle connection (a review). The socket is non-blocking and MSG_DONTWAIT keeps the peek
	// so; a peek consumes nothing.
	if err := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Data waiting (n > 0), the end of the stream (0 bytes, no error), or a socket error.
		spoke = n > 0 || err == nil || (err != syscall.EAGAIN && err != syscall.EWOULDBLOCK && err != syscall.EINTR)
	}); err != nil {
		return true
	}
	return spoke
}
