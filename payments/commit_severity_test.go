package payments

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
)

type errAfterCommit struct {
	mu    sync.Mutex
	armed bool
	body  string // ErrorResponse fields
}

type eacConn struct {
	net.Conn
	e      *errAfterCommit
	closed bool
}

func (c *eacConn) Read(p []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	commit := []byte{'C', 0, 0, 0, 11, 'C', 'O', 'M', 'M', 'I', 'T', 0}
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	if !c.e.armed || !bytes.Contains(p[:n], commit) {
		return n, err
	}
	buf := append([]byte(nil), p[:n]...)
	for !bytes.Contains(buf[bytes.Index(buf, commit):], []byte{'Z', 0, 0, 0, 5}) {
		tmp := make([]byte, 8192)
		m, rerr := c.Conn.Read(tmp)
		buf = append(buf, tmp[:m]...)
		if rerr != nil {
			break
		}
	}
	c.e.armed = false
	c.Conn.Close()
	c.closed = true
	body := []byte(c.e.body + "\x00")
	msg := append([]byte{'E', 0, 0, 0, 0}, body...)
	l := len(body) + 4
	msg[1], msg[2], msg[3], msg[4] = byte(l>>24), byte(l>>16), byte(l>>8), byte(l)
	return copy(p, msg), nil
}

// An ErrorResponse of severity FATAL or PANIC ends the connection whatever its code, and in
// answer to a COMMIT the server may have committed (a PANIC on the commit record's fsync, a
// proxy's FATAL with a code of its own). Read by its code alone (DatabaseUnavailable's list) it
// was "refused": the call-log row written again, a key, intent or claim kept until stale (a
// review). Here the server commits and the client is handed such an error instead of the answer.
func TestAFatalOrPanicAtCommitMayHaveCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	e := &errAfterCommit{}
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &eacConn{Conn: c, e: e}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc := NewService(pool, Config{LockTimeout: time.Second})
	if _, err := pool.Exec(ctx, `CREATE TABLE sev (k text)`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, body string }{
		{"FATAL 08P01 (control)", "SFATAL\x00VFATAL\x00C08P01\x00Mserver conn crashed?\x00"},
		{"PANIC 58030", "SPANIC\x00VPANIC\x00C58030\x00Mcould not fsync file \"pg_wal/0001\": Input/output error\x00"},
		{"FATAL XX000", "SFATAL\x00VFATAL\x00CXX000\x00Mproxy: backend gone\x00"},
	} {
		for _, rides := range []bool{false, true} {
			key := tc.name
			if rides {
				key += " (commitWith)"
			}
			e.mu.Lock()
			e.armed, e.body = true, tc.body
			e.mu.Unlock()
			may, err := svc.inTxCommit(ctx, "probe", func(tx pgx.Tx) error {
				if !rides {
					_, err := tx.Exec(ctx, `INSERT INTO sev VALUES ($1)`, key)
					return err
				}
				if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
					return err
				}
				var b pgx.Batch
				b.Queue(`INSERT INTO sev VALUES ($1)`, key)
				return commitWith(ctx, tx, &b)
			})
			var n int
			if qerr := pool.QueryRow(ctx, `SELECT count(*) FROM sev WHERE k = $1`, key).Scan(&n); qerr != nil {
				t.Fatal(qerr)
			}
			t.Logf("%s: err %v, mayHaveCommitted %v, committed rows %d", key, err, may, n)
			if err != nil && n == 1 && !may {
				t.Errorf("%s: committed, yet mayHaveCommitted = false (err %v)", key, err)
			}
		}
	}
}
