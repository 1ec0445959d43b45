//go:build !unix

package dbconn

import "net"

// serverSpoke cannot look without reading on this platform: pgxpool's idle rule alone decides.
func serverSpoke(net.Conn) bool { return false }
