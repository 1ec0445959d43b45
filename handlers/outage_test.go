package handlers_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"pitlane/access"
	"pitlane/payments"
)

// adminConn is a connection of the test's own to the test cluster's admin database, closed at
// the test's end: it outlives what it does to the bench's database.
func adminConn(t *testing.T) *pgx.Conn {
	t.Helper()
	admin, err := pgx.Connect(context.Background(), os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		t.Fatalf("admin connection: %v", err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	return admin
}

// outage cuts the bench's database off for real: no new connection is accepted
// (ALLOW_CONNECTIONS false) and every backend serving it is killed (pg_terminate_backend, what an
// administrator's restart or a failover does to open connections). The returned function ends it.
func outage(t *testing.T, db string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	admin := adminConn(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` ALLOW_CONNECTIONS false`)
	exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	restored := false
	restore = func() {
		if !restored {
			restored = true
			exec(`ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` ALLOW_CONNECTIONS true`)
		}
	}
	t.Cleanup(restore)
	return restore
}

// A database outage is retryable, never a 500: while PostgreSQL refuses this database and its
// backends are killed, the API answers 503 with Retry-After (problem code "unavailable"), and
// the console and the checkout answer the "try again" page with 503. When the database is back,
// the same server works again by itself. The main before this change answered 500 (the pool's
// connection errors were internal errors).
func TestDatabaseOutageIs503AndRecovers(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	var db string
	if err := b.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	p := wantPayment(t, b.do(post(createPath("o-before"), `{"amount":100,"currency":"EUR"}`)), http.StatusCreated)
	staff := newAgent(t, b.e)
	if _, err := b.access.CreateUser(context.Background(), payments.Staff{}, "sup@example.com", access.RoleSupport, testPassword); err != nil {
		t.Fatal(err)
	}
	staff.login("sup@example.com")

	restore := outage(t, db)
	for i, c := range []call{
		post(createPath("o-during"), `{"amount":100,"currency":"EUR"}`), // the first use of a killed connection
		post(createPath("o-during"), `{"amount":100,"currency":"EUR"}`), // a new connection, refused
		post(createPath("o-during"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k-outage"),
		get("/api/v1/payments/" + p.ID),
		post("/api/v1/payments/"+p.ID+"/check", ""),
	} {
		rec := b.do(c)
		pr := wantProblem(t, rec, http.StatusServiceUnavailable, "")
		if pr.Code != payments.EUNAVAIL || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("request %d (%s %s): %+v, Retry-After %q", i, c.method, c.path, pr, rec.Header().Get("Retry-After"))
		}
	}
	for _, path := range []string{"/", "/payments/" + p.ID, "/checkout/o-before"} {
		rec := staff.get(path)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("GET %s during the outage = %d (Retry-After %q)", path, rec.Code, rec.Header().Get("Retry-After"))
		}
		want := "Try again"
		if strings.HasPrefix(path, "/checkout/") {
			want = "look again" // a customer's look makes no claim about the money
		}
		wantText(t, page(t, rec, http.StatusServiceUnavailable), "error-retry", want)
	}

	restore()
	wantPayment(t, b.do(post(createPath("o-after"), `{"amount":100,"currency":"EUR"}`)), http.StatusCreated)
	// A key whose request met the outage is not burnt: the same request now goes through.
	wantPayment(t, b.do(post(createPath("o-during"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k-outage")), http.StatusCreated)
	if rec := staff.get("/payments/" + p.ID); rec.Code != http.StatusOK {
		t.Fatalf("console after the outage = %d", rec.Code)
	}
}
