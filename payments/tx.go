package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pipelinedTx is the core's transaction: a pgx.Tx whose BEGIN and SET LOCAL lock_timeout travel
// in the same pipeline as its first statement (pgx's Batch.BeginTx), so a transaction costs one
// round trip less than BEGIN, then the statements, then COMMIT. Every transaction of the core
// pays that round trip — a Create two, a patrol drive one or two — and on a 2-core machine the
// client's share of each round trip is most of what a Create costs beyond its SQL (see
// docs/performance.md).
//
// Nothing changes in what the transaction means: it is the same READ COMMITTED transaction with
// the same bounded lock wait, begun by the server when it reaches the BEGIN, just before the first
// statement, instead of one network exchange earlier (and no earlier snapshot exists to differ:
// under READ COMMITTED each statement takes its own). A transaction whose function sends nothing
// never reaches the server at all: Commit and Rollback are then no-ops.
//
// After the first statement every call goes to the pgx.Tx that batch began. The first statement
// may be a batch, a query, a row or an exec; its results are read exactly as the caller would
// read them from a plain transaction.
type pipelinedTx struct {
	db          *pgxpool.Pool
	lockTimeout string // "SET LOCAL lock_timeout = '5000ms'"
	tx          pgx.Tx // nil until the first statement is sent
	done        bool   // committed or rolled back
}

func newPipelinedTx(db *pgxpool.Pool, lockTimeout string) *pipelinedTx {
	return &pipelinedTx{db: db, lockTimeout: lockTimeout}
}

var _ pgx.Tx = (*pipelinedTx)(nil)

// first sends queue's statements behind BEGIN and SET LOCAL in one pipeline and returns the
// results positioned at the first of them. The transaction exists from here on (closed when
// even the BEGIN failed: Rollback then only gives the connection back).
func (t *pipelinedTx) first(ctx context.Context, queue []*pgx.QueuedQuery) (pgx.BatchResults, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(t.lockTimeout)
	b.QueuedQueries = append(b.QueuedQueries, queue...)
	br := t.db.SendBatch(ctx, b)
	t.tx = br.Tx()
	for range 2 { // BEGIN, SET LOCAL
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, fmt.Errorf("begin: %w", err)
		}
	}
	return br, nil
}

func (t *pipelinedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	br, err := t.first(ctx, b.QueuedQueries)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

func (t *pipelinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.tx != nil {
		return t.tx.Exec(ctx, sql, args...)
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
	if t.tx != nil {
		return t.tx.Query(ctx, sql, args...)
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
	if t.tx != nil {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	br, err := t.first(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
	if err != nil {
		return errRow{err}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

func (t *pipelinedTx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	if t.tx == nil {
		return nil // nothing was sent: there is nothing to commit
	}
	return t.tx.Commit(ctx)
}

func (t *pipelinedTx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// begun makes sure the transaction exists (for the calls that cannot ride in a pipeline).
func (t *pipelinedTx) begun(ctx context.Context) error {
	if t.tx != nil {
		return nil
	}
	br, err := t.first(ctx, nil)
	if err != nil {
		return err
	}
	return br.Close()
}

func (t *pipelinedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begun(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

func (t *pipelinedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begun(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

func (t *pipelinedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begun(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// LargeObjects is not used by the core; it exists once the transaction has sent something.
func (t *pipelinedTx) LargeObjects() pgx.LargeObjects {
	if t.tx == nil {
		panic("payments: LargeObjects before the transaction's first statement")
	}
	return t.tx.LargeObjects()
}

// Conn is the connection once the transaction has sent something (nil before).
func (t *pipelinedTx) Conn() *pgx.Conn {
	if t.tx == nil {
		return nil
	}
	return t.tx.Conn()
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
