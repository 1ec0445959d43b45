package testdb

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Statement is one statement a pool sent: its text and arguments (each query of a batch too).
type Statement struct {
	SQL  string
	Args []any
}

// StatementLog is a pgx tracer that writes down every statement a pool sends, for tests that
// check what reaches the server (plans of each one, the same work for two cases).
type StatementLog struct {
	mu    sync.Mutex
	stmts []Statement
}

func (l *StatementLog) add(sql string, args []any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stmts = append(l.stmts, Statement{SQL: sql, Args: append([]any(nil), args...)})
}

// Take returns the statements written down since the last Take and forgets them.
func (l *StatementLog) Take() []Statement {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.stmts
	l.stmts = nil
	return out
}

func (l *StatementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL, d.Args)
	return ctx
}
func (l *StatementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *StatementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l *StatementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL, d.Args)
}
func (l *StatementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Traced opens a second pool on pool's database whose statements log writes down, closed when
// the test ends.
func Traced(t testing.TB, pool *pgxpool.Pool, log *StatementLog) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Tracer = log
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: traced pool: %v", err)
	}
	t.Cleanup(traced.Close)
	return traced
}
