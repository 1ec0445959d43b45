// Package dbconn is how pitlane configures its PostgreSQL connections (a package of its own so
// that the tests' database helpers, which payments' own tests import, use the same rules).
package dbconn

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Configure is how every connection of pitlane is set up: CancelOnContextEnd, and
// ConnectTimeout when the URL gives no connect_timeout.
func Configure(cfg *pgconn.Config) {
	CancelOnContextEnd(cfg)
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = ConnectTimeout
	}
}

// ConfigurePool is Configure for a pool's connections, and a PingTimeout when the URL gives no
// pool_ping_timeout (or 0). pgxpool pings a connection that sat idle over a second before it
// hands it out, and without a ping timeout the ping may take the caller's whole deadline: after a
// failover that left the old host silent (no reset: a moved DNS name, a host gone), every idle
// connection of the pool was a request answered 503 at its bound (55 s by default) instead of a
// ping given up in PingTimeout and a fresh connection to the new host.
//
// And a connection the server has spoken on or closed while it sat in the pool is pinged too,
// however short its rest (ShouldPing), so the ping finds it dead and the pool hands out another:
// a pgbouncer restarted (or its KILL, a PostgreSQL restart, a backend terminated) tells every
// idle client connection FATAL and closes it, and the first statement on each — within a second
// of its last use, which is every connection of a busy pool — failed with that FATAL though the
// database was back: a Create whose gateway had registered its payment answered 202 without its
// confirmation URL, a keyed request 503 (an outside review, pgbouncer).
func ConfigurePool(cfg *pgxpool.Config) {
	Configure(&cfg.ConnConfig.Config)
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = PingTimeout
	}
	if cfg.ShouldPing == nil {
		cfg.ShouldPing = ShouldPing
	}
}

// ShouldPing is pgxpool's rule — a connection idle over a second is pinged before it is handed
// out — and a connection with something to read (the server said something unasked: a FATAL,
// its end) whatever its rest. Looking costs one non-blocking peek at the socket (serverSpoke).
func ShouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	return p.IdleDuration > time.Second || serverSpoke(p.Conn.PgConn().Conn())
}

// PingTimeout is how long a pooled connection's liveness ping may take: a living server answers
// in milliseconds, a loaded one well within it.
const PingTimeout = 2 * time.Second

// ConnectTimeout bounds a connection's start (TCP, TLS, authentication) when DATABASE_URL does
// not say connect_timeout: pgx has none, and `pitlane migrate` against a host that accepts a
// connection and never answers waited, silent, until someone killed it (an outside review).
const ConnectTimeout = 10 * time.Second

// CancelOnContextEnd makes a statement whose context ends stop on the server too: a cancel
// request goes to PostgreSQL (or the pgbouncer in front of it), and the connection is dropped
// only if the statement has not answered within cancelGrace. pgx's default only closes the
// client's socket, and a backend waiting on a lock does not notice that: the statement went on
// when the lock came free and, outside a transaction, committed after its request had been
// answered 503 "nothing was done" (a sign-out cut while its session's delete waited ended the
// session afterwards, unaudited). Every pool the service opens is configured with it (Configure:
// cmd/pitlane's pools; the tests' pools too).
func CancelOnContextEnd(cfg *pgconn.Config) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &cancelOnServer{conn: c}
	}
}

// cancelOnServer is pgx's CancelRequestContextWatcherHandler but for one thing: the cancel
// request runs on a context of its own, to the server's end of it (the server closes the cancel
// connection once the cancel is done). pgx's aborts it, and closes the cancel connection, the
// moment the canceled statement returns; pgbouncer 1.18 (Debian 12's) has often not finished
// forwarding it then, and exits (`FATAL … disconnect_client(): bad client state: 0`, pgbouncer
// issue #801): the first statement cut at its bound took every replica's database away (an
// outside review). Waiting for the server's end also orders the cancel before the connection's
// next statement, which pgx approximates with a 100 ms pause.
type cancelOnServer struct {
	conn     *pgconn.PgConn
	deadline time.Time
	done     chan struct{}
}

func (h *cancelOnServer) HandleCancel(context.Context) {
	h.deadline = time.Now().Add(cancelGrace)
	_ = h.conn.Conn().SetDeadline(h.deadline)
	done := make(chan struct{})
	h.done = done
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), cancelRequestBound)
		defer cancel()
		_ = h.conn.CancelRequest(ctx)
	}()
}

// HandleUnwatchAfterCancel waits for the cancel request, but not past the statement's own
// deadline: a statement that ran into it had no answer from the server, pgx drops its
// connection, and the cancel request goes on alone (its connection open until the server or
// pgbouncer closes it, or cancelRequestBound). Left as pgx leaves it: a statement that answered
// within the grace while its cancel request took longer than the rest of it (a server slower
// than 250 ms to take a cancel) keeps its connection, and the cancel may still land on the
// connection's next statement.
//
// A statement that ran into its deadline although its cancel request was taken (the host is
// alive) gets one more, before pgx drops the connection (pgx unwatches first): pgbouncer drops a
// cancel for a client that waits in its queue for a server connection ("cancel request for idle
// client"), the statement started when one came free, and it went on waiting on a lock after
// its caller had its error, then committed (an outside review). Sent now, the cancel reaches the
// server the client is linked to; a client still queued is dropped with its statement when pgx
// closes the connection.
func (h *cancelOnServer) HandleUnwatchAfterCancel() {
	defer func() { _ = h.conn.Conn().SetDeadline(time.Time{}) }()
	if !time.Now().Before(h.deadline) { // the statement ran into its deadline
		select {
		case <-h.done:
			ctx, cancel := context.WithTimeout(context.Background(), againBound)
			defer cancel()
			_ = h.conn.CancelRequest(ctx)
		default: // the first still goes (a silent host)
		}
		return
	}
	wait := time.NewTimer(time.Until(h.deadline))
	defer wait.Stop()
	select {
	case <-h.done:
	case <-wait.C:
	}
}

// againBound bounds the second cancel request of a statement that ran into its deadline, on a
// host that took the first: its caller waits for it (pgbouncer opens a server connection to
// forward it, tens of milliseconds; more on a loaded machine).
const againBound = time.Second

// cancelGrace is how long a canceled statement's connection waits for the server's answer
// before it is dropped (a host gone silent answers nothing; a living one answers in
// milliseconds). Short: on a silent host every cut statement costs it before its request can
// answer, inside web.WriteMargin.
const cancelGrace = 250 * time.Millisecond

// cancelRequestBound bounds a cancel request on its own connection (dial, TLS, the server's
// close): long, since closing it before pgbouncer has forwarded it is what crashes pgbouncer
// 1.18, and no caller waits for it past cancelGrace.
const cancelRequestBound = 5 * time.Second

// Rollback is how long a transaction's ROLLBACK after an error may take: the connection now
// survives a cancel the server answered, so the ROLLBACK is real, and a host that goes silent
// just then must not hold its caller (the socket is dropped; the pool discards the connection).
func Rollback(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), RollbackBound)
}

// RollbackBound bounds Rollback's context.
const RollbackBound = 2 * time.Second
