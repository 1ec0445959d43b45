package testdb

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"testing"
)

// FreezeProxy forwards TCP to PostgreSQL. The first connection on which the client sends its
// trap is frozen: from then on nothing is forwarded on it in either direction — the host that
// connection reached went silent (a failover that moved the name, a host gone, pgbouncer PAUSEd
// for good) — while every other and every new connection goes through as before (the new
// primary answers). The test's cleanup thaws and closes everything.
type FreezeProxy struct {
	ln     net.Listener
	target string
	trap   []byte
	once   sync.Once
	frozen chan struct{} // closed when the trap sprang
	thaw   chan struct{} // closed at cleanup
	mu     sync.Mutex
	conns  []net.Conn
}

// FreezeVia is a database URL like raw that reaches its server through a FreezeProxy whose trap
// is the SQL text trap.
func FreezeVia(t testing.TB, raw, trap string) (string, *FreezeProxy) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FreezeProxy{ln: ln, target: u.Host, trap: []byte(trap), frozen: make(chan struct{}), thaw: make(chan struct{})}
	go p.accept()
	t.Cleanup(func() {
		close(p.thaw)
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	u.Host = ln.Addr().String()
	return u.String(), p
}

// Frozen is closed once a connection sent the trap and went silent.
func (p *FreezeProxy) Frozen() <-chan struct{} { return p.frozen }

func (p *FreezeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *FreezeProxy) forward(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, s)
	p.mu.Unlock()
	iced := make(chan struct{}) // closed once this connection is frozen
	pipe := func(dst, src net.Conn, fromClient bool) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if fromClient && bytes.Contains(buf[:n], p.trap) {
					p.once.Do(func() { close(iced); close(p.frozen) })
				}
				select {
				case <-iced:
					<-p.thaw // silent until cleanup
				default:
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(s, c, true)
	pipe(c, s, false)
}
