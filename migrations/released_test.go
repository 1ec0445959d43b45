package migrations_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"pitlane/internal/testdb"
	"pitlane/migrations"
)

// A released migration is never edited: goose never runs an applied version again, so an edit
// reaches only new databases, and an upgraded one silently differs (00020, 00330 and 00490 were
// edited after their first commit; 00710 repairs them). released.sha256 holds every file's hash;
// a file that differs from it, or is missing from it, fails here. Negative control: any edit of
// an existing migration (or a new file without its line) fails.
func TestReleasedMigrationsAreNeverEdited(t *testing.T) {
	f, err := os.Open("released.sha256")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	released := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("released.sha256: %q is not a sha256sum line", line)
		}
		released[name] = sum
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		b, err := migrations.FS.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		sum := hex.EncodeToString(h[:])
		switch want, ok := released[name]; {
		case !ok:
			t.Errorf("%s is not in released.sha256: add its line (sha256sum %s >> migrations/released.sha256)", name, name)
		case want != sum:
			t.Errorf("%s was edited after its release (sha256 %s, released %s): a database that applied it never runs it again; "+
				"undo the edit and write a new migration", name, sum, want)
		}
		delete(released, name)
	}
	for name := range released {
		t.Errorf("%s is in released.sha256 but not among the migrations: a released migration is never removed", name)
	}
}

// A database that applied 00020, 00330 and 00490 as they were first committed ends, after
// migrate, as a new one: password_linked exists (every code confirmation and four-eyes approval
// calls it), the heartbeat triggers notify the dashboard, and the lease index that slowed every
// patrol claim is gone. The database is made the way those first versions left it: migrated to
// 00700, then the three differences put back by hand. Negative control: without 00710 the
// function is missing, the triggers too, and the index stays.
func TestEditedMigrationsAreRepaired(t *testing.T) {
	ctx := context.Background()
	url := testdb.NewEmptyURL(t)
	pool := testdb.Pool(t, url)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 700); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`DROP FUNCTION password_linked(text, text)`,
		`DROP TRIGGER sweeper_heartbeats_live ON sweeper_heartbeats`,
		`DROP TRIGGER sweeper_heartbeats_live_update ON sweeper_heartbeats`,
		`CREATE INDEX payment_sessions_leased ON payment_sessions (lease_until, id) WHERE lease_until IS NOT NULL`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	var linked bool
	if err := pool.QueryRow(ctx, `SELECT password_linked('a@example.com', 'b@example.com')`).Scan(&linked); err != nil {
		t.Errorf("password_linked after migrate: %v", err)
	}
	var triggers, indexes int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_trigger WHERE tgname IN ('sweeper_heartbeats_live', 'sweeper_heartbeats_live_update')),
		(SELECT count(*) FROM pg_indexes WHERE indexname = 'payment_sessions_leased')`).Scan(&triggers, &indexes); err != nil {
		t.Fatal(err)
	}
	if triggers != 2 || indexes != 0 {
		t.Errorf("after migrate: %d heartbeat triggers (want 2), %d lease indexes (want 0)", triggers, indexes)
	}
	// The repair changes nothing on a database that ran today's files: it may run again.
	if _, err := p.DownTo(ctx, 700); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("00710 again: %v", err)
	}
}
