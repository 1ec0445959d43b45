// Package dbconn is how pitlane configures its PostgreSQL connections (a package of its own so
// that the tests' database helpers, which payments' own tests import, use the same rules).
package dbconn

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// Configure is how every connection of pitlane is set up: CancelOnContextEnd, and
// ConnectTimeout when the URL gives no connect_timeout.
func Configure(cfg *pgconn.Config) {
	CancelOnContextEnd(cfg)
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = ConnectTimeout
	}
}

// ConnectTimeout bounds a connection's start (TCP, TLS, authentication) when DATABASE_URL does
// not say connect_timeout: pgx has none, and `pitlane migrate` against a host that accepts a
// connection and never answers waited, silent, until someone killed it (an outside review).
const ConnectTimeout = 10 * time.Second

// CancelOnContextEnd makes a statement whose context ends stop on the server too: pgx sends
// PostgreSQL a cancel request (and drops the connection only if no answer comes within
// cancelGrace). pgx's default only closes the client's socket, and a backend waiting on a lock
// does not notice that: the statement went on when the lock came free and, outside a
// transaction, committed after its request had been answered 503 "nothing was done" (a sign-out
// cut while its session's delete waited ended the session afterwards, unaudited). Every pool the
// service opens is configured with it (Configure: cmd/pitlane's pools; the tests' pools too).
func CancelOnContextEnd(cfg *pgconn.Config) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
}

// cancelGrace is how long a canceled statement's connection waits for the server's answer to
// the cancel request before it is dropped (a host gone silent answers nothing; a living one
// answers in milliseconds). Short: on a silent host every cut statement costs it (and pgx's
// 100 ms pause after a cancel) before its request can answer, inside web.WriteMargin.
const cancelGrace = 250 * time.Millisecond

// Rollback is how long a transaction's ROLLBACK after an error may take: the connection now
// survives a cancel the server answered, so the ROLLBACK is real, and a host that goes silent
// just then must not hold its caller (the socket is dropped; the pool discards the connection).
func Rollback(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), RollbackBound)
}

// RollbackBound bounds Rollback's context.
const RollbackBound = 2 * time.Second
