// Package dbconn is how pitlane configures its PostgreSQL connections (a package of its own so
// that the tests' database helpers, which payments' own tests import, use the same rules).
package dbconn

import (
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// CancelOnContextEnd makes a statement whose context ends stop on the server too: pgx sends
// PostgreSQL a cancel request (and drops the connection only if no answer comes within
// cancelGrace). pgx's default only closes the client's socket, and a backend waiting on a lock
// does not notice that: the statement went on when the lock came free and, outside a
// transaction, committed after its request had been answered 503 "nothing was done" (a sign-out
// cut while its session's delete waited ended the session afterwards, unaudited). Every pool the
// service opens is configured with it (cmd/pitlane's openPool; the tests' pools too).
func CancelOnContextEnd(cfg *pgconn.Config) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
}

// cancelGrace is how long a canceled statement's connection waits for the server's answer to
// the cancel request before it is dropped (a host gone silent answers nothing).
const cancelGrace = time.Second
