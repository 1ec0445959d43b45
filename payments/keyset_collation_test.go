package payments

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/internal/testdb"
	"pitlane/migrations"
)

// danishDB is a migrated database whose default collation is ICU Danish, as a database
// created on a host with LANG=da_DK.UTF-8 (or a cloud's da locale) gets: there "aa" is the letter
// å and sorts after z.
func danishDB(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	server := testdb.ServerURL(t)
	admin := testdb.Pool(t, server)
	name := "da_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER icu ICU_LOCALE 'da' LOCALE 'C'`); err != nil {
		t.Fatalf("create database: %v", err)
	}
	u, _ := url.Parse(server)
	u.Path = "/" + name
	t.Cleanup(func() { admin.Exec(context.Background(), `DROP DATABASE `+name+` WITH (FORCE)`) }) //nolint:errcheck
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return u.String()
}

// TestKeysetListsKeepEveryRowUnderADanishCollation: the console's keyset lists ordered by "id",
// which in ORDER BY named the output column id::text (sessionColumns, refundColumns) and so sorted
// by the database's collation, while the keyset's row comparison reads the uuid. Where the two
// orders differ (a Danish collation: "aa…" is å, after "ab…"), payments sharing created_at (one
// clock tick) or sessions sharing flagged_at (one patrol release flags a batch at one instant)
// were skipped between pages, on no page ever (an outside review, console lists). The lists order
// by the table's column now; TestNoQueryOrdersByTheTextOfAnID keeps every statement so.
func TestKeysetListsKeepEveryRowUnderADanishCollation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, danishDB(t))
	svc := NewService(pool, Config{})
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

	// Two payments created in the same microsecond.
	ids := []string{"aa000000-0000-4000-8000-000000000000", "ab000000-0000-4000-8000-000000000000"}
	for i, id := range ids {
		order := fmt.Sprintf("tie-%d", i)
		if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, $2, $2)`, order, at); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, next_check_at,
			flagged_at, flag_reason, created_at, updated_at)
			VALUES ($1, $2, 100, 'EUR', 'Unknown', 'fake', NULL, $3, 'schedule ran out', $3, $3)`, id, order, at); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	before := ""
	for range 3 {
		p, err := svc.ListPayments(ctx, PaymentFilter{Query: "tie-", Before: before, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Sessions {
			seen[s.ID] = true
		}
		if before = p.Next; before == "" {
			break
		}
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("payments list, one per page: payment %s was never shown (pages showed %v)", id, seen)
		}
	}

	// The flagged list: 501 sessions flagged at one instant (a page is 500): the two above and
	// 499 more (ids c0000000-…, after both in either order).
	if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) SELECT 'f-' || i, $1, $1 FROM generate_series(1, 499) i`, at); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, next_check_at,
			flagged_at, flag_reason, created_at, updated_at)
		SELECT ('c0000000-0000-4000-8000-' || lpad(i::text, 12, '0'))::uuid, 'f-' || i, 100, 'EUR', 'Unknown', 'fake', NULL, $1, 'schedule ran out', $1, $1 FROM generate_series(1, 499) i`, at); err != nil {
		t.Fatal(err)
	}
	all := map[string]int{}
	after := ""
	for range 5 {
		f, err := svc.ListFlagged(ctx, after)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range f.Sessions {
			all[s.ID]++
		}
		if after = f.Next; after == "" {
			break
		}
	}
	if len(all) != 501 {
		t.Errorf("flagged list: the pages showed %d distinct sessions of the 501 flagged", len(all))
	}
}

// TestNoQueryOrdersByTheTextOfAnID: a statement selecting sessionColumns or refundColumns (whose
// first column is id::text, named "id") must not ORDER BY a bare id: that is the text, in the
// database's collation, not the uuid a keyset compares (TestKeysetListsKeepEveryRowUnderADanishCollation)
// or the order row locks are taken in. Qualify it (payment_sessions.id, refunds.id).
func TestNoQueryOrdersByTheTextOfAnID(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	uses := regexp.MustCompile(`(sessionColumns|refundColumns)`)
	bare := regexp.MustCompile(`ORDER BY[^\n` + "`" + `]*(^|[^.\w])(id|session_id)\b`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(src)
		for _, m := range uses.FindAllStringIndex(s, -1) {
			// The statement: up to the end of its last literal, "`," or "`)" (its pieces are
			// joined with "` + … + `"), and no further than a function's end.
			stmt := s[m[1]:min(len(s), m[1]+1500)]
			for _, end := range []string{"`,", "`)", "\n}\n"} {
				if i := strings.Index(stmt, end); i >= 0 {
					stmt = stmt[:i]
				}
			}
			if o := bare.FindString(stmt); o != "" {
				t.Errorf("%s:%d: %q orders by the text of an id", f, strings.Count(s[:m[0]], "\n")+1, o)
			}
		}
	}
}
