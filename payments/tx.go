package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pipelinedTx is the core's transaction: a pgx.Tx whose BEGIN and SET LOCALs (lock_timeout,
// idle_in_transaction_session_timeout) travel in the same pipeline as its first statement, and
// whose COMMIT may travel in the pipeline of its last (commitWith), so a transaction of one
// pipelined batch is one round trip where BEGIN, the batch and COMMIT were three. Every transaction of the core pays those round trips — a Create
// two, a patrol drive one or two — and on a 2-core machine the client's share of each round trip
// is most of what a Create costs beyond its SQL (see docs/performance.md).
//
// Nothing changes in what the transaction means: it is the same READ COMMITTED transaction with
// the same bounded lock wait, begun by the server when it reaches the BEGIN, just before the first
// statement, instead of one network exchange earlier (and no earlier snapshot exists to differ:
// under READ COMMITTED each statement takes its own). A transaction whose function sends nothing
// never reaches the server at all: Commit and Rollback are then no-ops.
//
// It runs on a pool connection of its own, acquired with the first statement, and manages BEGIN,
// COMMIT and ROLLBACK itself (pgx's own Tx would send its COMMIT or ROLLBACK even after a
// pipeline committed). The connection goes back to the pool when the transaction ends; one left
// inside a transaction (a failed COMMIT or ROLLBACK) is destroyed by the pool, as pgx does.
//
// Or it runs on a connection its caller already holds (held), which stays the caller's: the
// transaction ends without giving it back.
type pipelinedTx struct {
	db       *pgxpool.Pool
	held     *pgxpool.Conn // the caller's connection, or nil: one of the pool's
	setLocal []string      // "SET LOCAL lock_timeout = '5000ms'", …
	conn     *pgxpool.Conn // nil until the first statement is sent
	done     bool          // committed or rolled back
	// mayHaveCommitted: a COMMIT was sent whose failure does not prove the server skipped or
	// refused it (its answer was lost: a connection's end, pgbouncer's FATAL, a cut context), so
	// the transaction may have committed. Read by inTxCommit.
	mayHaveCommitted bool
}

func newPipelinedTx(db *pgxpool.Pool, held *pgxpool.Conn, setLocal ...string) *pipelinedTx {
	return &pipelinedTx{db: db, held: held, setLocal: setLocal}
}

var _ pgx.Tx = (*pipelinedTx)(nil)

// errNestedTx: the core takes no savepoints.
var errNestedTx = errors.New("payments: nested transactions (savepoints) are not supported")

// first acquires the connection and sends queue's statements behind BEGIN and SET LOCALs in one
// pipeline; it returns the results positioned at the first of them.
func (t *pipelinedTx) first(ctx context.Context, queue []*pgx.QueuedQuery) (pgx.BatchResults, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	conn := t.held
	if conn == nil {
		var err error
		if conn, err = t.db.Acquire(ctx); err != nil {
			return nil, fmt.Errorf("begin: %w", err)
		}
	}
	t.conn = conn
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	for _, q := range t.setLocal {
		b.Queue(q)
	}
	b.QueuedQueries = append(b.QueuedQueries, queue...)
	br := conn.SendBatch(ctx, b)
	for range 1 + len(t.setLocal) { // BEGIN, SET LOCALs
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, fmt.Errorf("begin: %w", err)
		}
	}
	return br, nil
}

func (t *pipelinedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.done {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	if t.conn != nil {
		return t.conn.SendBatch(ctx, b)
	}
	br, err := t.first(ctx, b.QueuedQueries)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// commitWith sends b with COMMIT queued after its statements: when every statement succeeds the
// transaction is committed in the same round trip, and the Commit that follows (inTx's) only
// gives the connection back. When one fails, the server skips the rest of the pipeline, COMMIT
// included, and the transaction rolls back as usual. So b's result callbacks must not reject
// anything the server accepted: by the time they run, it is committed.
func (t *pipelinedTx) commitWith(ctx context.Context, b *pgx.Batch) error {
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	err := t.SendBatch(ctx, b).Close()
	t.sentCommit(err)
	return err
}

// sentCommit records what a COMMIT that was sent (alone or riding a batch) ended with: when it
// failed, whether it may have committed all the same. The server refusing a statement before it
// (a guard raised in SQL) skips it; the server answering it ROLLBACK rolled back; a statement
// never sent (pgconn.SafeToRetry) sent no COMMIT either. A connection's end is no refusal:
// pgbouncer answers a COMMIT whose server died with FATAL 08P01, PostgreSQL one whose synchronous
// replication it stopped waiting for with FATAL 57P01 after committing locally (mayHaveRun).
func (t *pipelinedTx) sentCommit(err error) {
	t.mayHaveCommitted = err != nil && !errors.Is(err, pgx.ErrTxCommitRollback) && mayHaveRun(err)
}

// commitWith is pipelinedTx.commitWith for any transaction: another pgx.Tx sends b, and its
// caller commits as usual.
func commitWith(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	if t, ok := tx.(*pipelinedTx); ok {
		return t.commitWith(ctx, b)
	}
	return tx.SendBatch(ctx, b).Close()
}

func (t *pipelinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.done {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if t.conn != nil {
		return t.conn.Exec(ctx, sql, args...)
	}
	br, err := t.first(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *pipelinedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	if t.conn != nil {
		return t.conn.Query(ctx, sql, args...)
	}
	br, err := t.first(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (t *pipelinedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.done {
		return errRow{pgx.ErrTxClosed}
	}
	if t.conn != nil {
		return t.conn.QueryRow(ctx, sql, args...)
	}
	br, err := t.first(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
	if err != nil {
		return errRow{err}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

// end gives the connection back (the pool destroys one still inside a transaction); a held
// connection stays with the caller.
func (t *pipelinedTx) end() {
	t.done = true
	if t.conn != nil && t.held == nil {
		t.conn.Release()
	}
}

func (t *pipelinedTx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	defer t.end()
	if t.conn == nil || t.conn.Conn().PgConn().TxStatus() == 'I' {
		return nil // nothing was sent, or commitWith committed
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	t.sentCommit(err)
	return err
}

func (t *pipelinedTx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	defer t.end()
	if t.conn == nil || t.conn.Conn().IsClosed() || t.conn.Conn().PgConn().TxStatus() == 'I' {
		return nil
	}
	if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("rollback failed: %w", err)
	}
	return nil
}

// begun makes sure the transaction exists (for the calls that cannot ride in a pipeline).
func (t *pipelinedTx) begun(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	if t.conn != nil {
		return nil
	}
	br, err := t.first(ctx, nil)
	if err != nil {
		return err
	}
	return br.Close()
}

func (t *pipelinedTx) Begin(context.Context) (pgx.Tx, error) { return nil, errNestedTx }

func (t *pipelinedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begun(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *pipelinedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begun(ctx); err != nil {
		return nil, err
	}
	return t.conn.Conn().Prepare(ctx, name, sql)
}

// LargeObjects is not used by the core (pgx builds them only over its own Tx).
func (t *pipelinedTx) LargeObjects() pgx.LargeObjects {
	panic("payments: large objects are not used by the core")
}

// Conn is the connection once the transaction has sent something (nil before).
func (t *pipelinedTx) Conn() *pgx.Conn {
	if t.conn == nil {
		return nil
	}
	return t.conn.Conn()
}

// batchRows are the rows of a transaction's first query: closing them (or reading past the last)
// also reads the pipeline to its end, so the connection is free for the next statement.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// batchRow is the row of a transaction's first QueryRow; scanning it ends the pipeline.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	cerr := r.br.Close()
	if err != nil {
		return err
	}
	if cerr != nil && !errors.Is(cerr, pgx.ErrNoRows) {
		return cerr
	}
	return nil
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
