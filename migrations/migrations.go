// Package migrations holds pitlane's numbered SQL migrations, embedded into the binary, and the
// one way to apply them (goose).
//
// Applying is safe when several replicas run `pitlane migrate` at the same moment: goose's
// Postgres table locker serialises them through a lock row with a lease (not a session-level
// advisory lock, so it also works through pgbouncer in transaction mode), and every replica
// after the first finds nothing pending. Files are numbered by range so parallel work does not
// collide: 000xx core, 001xx gateways and webhooks, 002xx API, 003xx console, 004xx access.
package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var FS embed.FS

// lockProbe is how often a migrate waiting for another one's lock looks again. It waits as long
// as the other one holds the lock (its lease renewed by heartbeat; a holder that died loses it
// within the 30 s lease) or until its context ends: goose's default gave up after 60 probes (5
// minutes) and exited 1 while the first one, building an index CONCURRENTLY behind a backup's
// snapshot, say, went on and succeeded — a deploy step failed for nothing.
var lockProbe = 5 * time.Second

// lockRetryable is whether a failed take of goose's lock row is worth another look: the lock
// held by another migrate (not a database error), a connection lost, a serialization failure, a
// deadlock, a lock timeout, a server shutting down or out of connections. Not a
// database that refuses the write for good — read-only (a hot standby or a reader endpoint named
// by mistake, default_transaction_read_only), no privilege on goose_lock, a missing table: goose
// retried those every 5 s for ever, printing nothing, and the deploy's first step hung (an
// outside review). They end the migrate with the database's own words.
func lockRetryable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return true
	}
	switch pe.Code {
	case "53300", "55P03", "55006": // too many connections, a lock not available, an object in use
		return true
	}
	switch pe.Code[:min(2, len(pe.Code))] {
	case "08", "40", "57": // the connection, a serialization failure or deadlock, a shutdown or cancel
		return true
	}
	return false // a disk full or a corrupted page ends it too: someone must look
}

// NewProvider returns a goose provider over the embedded migrations with a table-based lock.
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresTableLocker(lock.WithTableLockTimeout(lockProbe, math.MaxUint64),
		lock.WithTableRetryPolicy(lockRetryable))
	if err != nil {
		return nil, fmt.Errorf("migrations: locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		// Files are numbered by range (see the package comment), so a core migration written
		// after a console one has a lower number; apply it rather than refuse the database.
		goose.WithAllowOutofOrder(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: provider: %w", err)
	}
	return p, nil
}

// Up applies every pending migration and returns how many it applied (0 when current).
func Up(ctx context.Context, db *sql.DB) (int, error) {
	p, err := NewProvider(db)
	if err != nil {
		return 0, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return len(res), fmt.Errorf("migrations: up: %w", err)
	}
	return len(res), nil
}

// Current reports whether the database has every embedded migration applied.
func Current(ctx context.Context, db *sql.DB) (bool, error) {
	p, err := NewProvider(db)
	if err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: status: %w", err)
	}
	return !pending, nil
}

// Hash identifies the schema the embedded migrations produce (names and contents), so test
// templates are rebuilt exactly when a migration changes.
func Hash() (string, error) {
	names, err := fs.Glob(FS, "*.sql")
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := FS.ReadFile(n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
