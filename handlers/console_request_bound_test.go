package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// answered runs do and returns its answer; one still unanswered after a minute (it waits as long
// as the database does) fails the test after release lets it end.
func answered(t *testing.T, what string, do func() *httptest.ResponseRecorder, release func()) *httptest.ResponseRecorder {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- do() }()
	select {
	case rec := <-done:
		return rec
	case <-time.After(time.Minute):
		release()
		<-done
		t.Fatalf("%s: no answer in a minute, the request waits as long as its database", what)
		return nil
	}
}

// poolOfOne is a pool of a single connection to of's database, closed when the test ends;
// take takes that connection (the database then answers nothing through the pool) and returns
// its release, which may be called more than once and is called at the end in any case.
func poolOfOne(t *testing.T, of *pgxpool.Pool) (pool *pgxpool.Pool, take func() (release func())) {
	t.Helper()
	pool = testdb.PoolOf(t, of, 1)
	return pool, func() func() {
		held, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(held.Release) // before the pool's Close, which waits for it; a second Release is a no-op
		return held.Release
	}
}

// holdInTx runs sql in a transaction of its own on pool and holds it (and the locks sql took)
// until the returned release, which may be called more than once and is called at the test's
// end in any case.
func holdInTx(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Rollback(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
	return release
}

// holdCreateLock holds order's claim lock in a transaction of another replica until the returned
// release (which may be called more than once, and is at the test's end in any case).
func holdCreateLock(t *testing.T, pool *pgxpool.Pool, order string) (release func()) {
	t.Helper()
	return holdInTx(t, pool, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(payments.LockCreateOrder), order)
}

// A console or checkout page whose database does not answer is a readable 503 page within the
// request's bound (as an API call is), and the same page works once the database answers:
// every connection of the pool taken (the staff member's session cannot even be loaded; the
// customer's order cannot be read), and a claim lock that is never let go while the lock wait is
// long (a staff member's Start: nothing is registered or written, and the same form starts the
// payment afterwards). Before, the page waited as long as the database did, until the server's
// write timeout dropped the connection with no answer at all.
func TestPageWhoseDatabaseDoesNotAnswerIs503WithinItsBound(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "ops@example.com", access.RoleSupport)
	pool, take := poolOfOne(t, b.pool)
	longLocks := func(c *payments.Config) { c.LockTimeout = 10 * time.Minute }
	// The same replica without the bound: the sign-in and the pages once the database answers,
	// which a loaded test machine under -race answered past 300 ms now and then (503 at login).
	_, free := b.replica(pool, "replica-bound", b.gw, longLocks)
	b.deps = func(d *web.Deps) { d.RequestTimeout = 300 * time.Millisecond }
	_, e := b.replica(pool, "replica-bound", b.gw, longLocks)
	staff := newAgent(t, free)
	staff.login("ops@example.com")
	customer := newAgent(t, free)
	link := b.link(t, "o-bound-pay", 1500, "EUR")
	bounded := func(a *agent, do func() *httptest.ResponseRecorder) func() *httptest.ResponseRecorder {
		return func() *httptest.ResponseRecorder {
			a.h = e
			defer func() { a.h = free }()
			return do()
		}
	}

	want503 := func(rec *httptest.ResponseRecorder, words string) {
		t.Helper()
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("status %d, Retry-After %q: want 503 with Retry-After; body:\n%s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
		}
		if !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") || !strings.Contains(rec.Body.String(), words) {
			t.Fatalf("503 page without %q:\n%s", words, rec.Body)
		}
	}

	release := take()
	want503(answered(t, "GET /payments", bounded(staff, func() *httptest.ResponseRecorder { return staff.get("/payments") }), release),
		"did not answer in time")
	want503(answered(t, "GET "+link, bounded(customer, func() *httptest.ResponseRecorder { return customer.get(link) }), release),
		"do not pay again")
	release()
	page(t, staff.get("/payments"), http.StatusOK) // still signed in
	page(t, customer.get(link), http.StatusOK)

	release = holdCreateLock(t, b.pool, "o-bound-lock")
	page(t, staff.get("/payments/new"), http.StatusOK) // the form's CSRF token
	start := url.Values{"order_id": {"o-bound-lock"}, "amount": {"25.00"}, "currency": {"EUR"}, "customer_contact": {"cust@example.com"}}
	want503(answered(t, "POST /payments", bounded(staff, func() *httptest.ResponseRecorder { return staff.post("/payments", start) }), release),
		"did not answer in time")
	release()
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-bound-lock'`); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("a cut Start left %d sessions and %d registrations", n, b.gw.Calls(fakegw.OpRegister))
	}
	if rec := staff.post("/payments", start); rec.Code != http.StatusSeeOther {
		t.Fatalf("Start once the lock is free: %d\n%s", rec.Code, rec.Body)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("%d registrations, want one", n)
	}

	// A form whose statement the cut cancels (a Check behind its order's row) is the bound's page
	// too, not a "busy" flash on the way back (its SQLSTATE 57014 reads as busy in the core: a
	// review of the session's diff).
	s := b.payment(t, "o-bound-row", 700)
	release = holdInTx(t, b.pool, `SELECT 1 FROM orders WHERE order_id = $1 FOR UPDATE`, "o-bound-row")
	page(t, staff.get("/payments/"+s.ID), http.StatusOK) // the form's CSRF token
	want503(answered(t, "POST check", bounded(staff, func() *httptest.ResponseRecorder { return staff.post("/payments/"+s.ID+"/check", nil) }), release),
		"did not answer in time")
	release()
}

// The pages that run longer by design are not cut at the bound: the CSV exports and the stuck
// list's bulk check move their own write deadlines (and a live stream, routed the same way,
// stays open for as long as its page).
func TestLongPagesAreNotCutAtTheBound(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.user(t, "admin@example.com", access.RoleAdmin)
	b.deps = func(d *web.Deps) { d.RequestTimeout = time.Nanosecond }
	_, e := b.replica(b.pool, "replica-cut", b.gw)
	if rec := newAgent(t, e).get("/login"); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("a page under a bound of 1ns: %d, want 503 (the control of this test)", rec.Code)
	}
	fin := newAgent(t, b.e)
	fin.login("fin@example.com")
	fin.h = e
	if rec := fin.get("/finance/ledger.csv"); rec.Code != http.StatusOK {
		t.Fatalf("ledger export under a bound of 1ns: %d\n%s", rec.Code, rec.Body)
	}
	if rec := fin.post("/finance/stuck/check", url.Values{}); rec.Code != http.StatusSeeOther {
		t.Fatalf("stuck list's check under a bound of 1ns: %d\n%s", rec.Code, rec.Body)
	}
	admin := newAgent(t, b.e)
	admin.login("admin@example.com")
	admin.h = e
	if rec := admin.get("/admin/audit.csv"); rec.Code != http.StatusOK {
		t.Fatalf("audit export under a bound of 1ns: %d\n%s", rec.Code, rec.Body)
	}
}

// holdExpiredSession inserts an expired session row and holds it FOR UPDATE in a transaction
// until the returned release (called at the test's end in any case): a sign-in's reaping of
// expired sessions would wait on it.
func holdExpiredSession(t *testing.T, pool *pgxpool.Pool) (release func()) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO sessions (token, data, expiry) VALUES ('expired-held', '\x00', now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	return holdInTx(t, pool, `SELECT 1 FROM sessions WHERE token = 'expired-held' FOR UPDATE`)
}

// A sign-in or a renewal ("sign out everywhere else") does not wait on the expired rows it
// reaps on its way: here another transaction holds one, and both answer within the page's bound
// and keep their session. Before, the reaping waited until the bound cut it: the sign-in's next
// step failed (503, signed in or not), a renewal's old session row was gone and its new one was
// saved on the ended context (an outside review: "done", and the browser signed out).
func TestSignInDoesNotWaitOnTheRowsItReaps(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "ops@example.com", access.RoleSupport)
	// A bound the held row would outlast (it is held until release), yet long enough for a
	// sign-in's password check under -race on a loaded machine: a CI run answered 503 at 500 ms.
	b.deps = func(d *web.Deps) { d.RequestTimeout = 5 * time.Second }
	_, e := b.replica(b.pool, "replica-renew", b.gw)
	release := holdExpiredSession(t, b.pool)

	staff := newAgent(t, e)
	page(t, staff.get("/login"), http.StatusOK)
	rec := staff.post("/login", url.Values{"email": {"ops@example.com"}, "password": {testPassword}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/" {
		t.Fatalf("sign-in: %d %q\n%s", rec.Code, rec.Header().Get("Location"), rec.Body)
	}
	page(t, staff.get("/account"), http.StatusOK)

	rec = staff.post("/account/sessions", url.Values{})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/account" {
		t.Fatalf("sign out everywhere else: %d %q\n%s", rec.Code, rec.Header().Get("Location"), rec.Body)
	}
	release()
	page(t, staff.get("/account"), http.StatusOK) // still signed in, in this browser
	if n := b.count(t, `SELECT count(*) FROM sessions WHERE token <> 'expired-held' AND expiry > now()`); n != 1 {
		t.Fatalf("%d live sessions, want this browser's one", n)
	}
}

// The customer back from the bank, whose return page is cut at its bound, is not told "nothing
// was charged": they have just paid (the payment is Completed once the database answers). The
// page of a look says to look again and not to pay again; a Pay click cut before it registered
// still says nothing was charged (TestCheckoutPayRefusalsLeadBackToTheOrder).
func TestCutReturnPageMakesNoClaimAboutTheMoney(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	sess := b.payment(t, "o-bound-paid", 1500)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded) // the customer paid at the bank
	pool, take := poolOfOne(t, b.pool)
	b.deps = func(d *web.Deps) { d.RequestTimeout = 300 * time.Millisecond }
	_, e := b.replica(pool, "replica-return", b.gw)
	customer := newAgent(t, e)
	release := take()
	rec := answered(t, "return", func() *httptest.ResponseRecorder { return customer.get(b.orderPage("o-bound-paid", "/return")) }, release)
	release()
	doc := page(t, rec, http.StatusServiceUnavailable)
	if got := doc.Find(testid("error-retry")).Text(); strings.Contains(got, "nothing was charged") || !strings.Contains(got, "do not pay again") {
		t.Fatalf("the cut return page says %q", got)
	}
	// The look again, on a replica without the 300 ms bound: the cut look's own records may
	// still hold the one connection for a moment (a CI run under -race answered 503 here).
	customer.h = b.e
	page(t, customer.get(b.orderPage("o-bound-paid", "/return")), http.StatusOK)
	if got, err := b.svc.Get(t.Context(), sess.ID); err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("after the outage: %v %v, want Completed", got.Status, err)
	}
}

// A sign-out cut at its bound before its session ended is not audited as a sign-out: the
// session ends first, the entry follows. Here the session row's delete waits on a held lock
// past the bound: 503, the session still works, and the audit log says so (no "logout").
// Before, the entry was written first (it outlives the request) and claimed a sign-out that
// never happened.
func TestSignOutCutBeforeTheSessionEndedIsNotAudited(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "ops@example.com", access.RoleSupport)
	b.deps = func(d *web.Deps) { d.RequestTimeout = 300 * time.Millisecond }
	_, e := b.replica(b.pool, "replica-logout", b.gw)
	staff := newAgent(t, b.e)
	staff.login("ops@example.com")
	page(t, staff.get("/account"), http.StatusOK) // the form's CSRF token, without the bound

	staff.h = e
	release := holdInTx(t, b.pool, `SELECT 1 FROM sessions FOR UPDATE`)
	rec := answered(t, "POST /logout", func() *httptest.ResponseRecorder { return staff.post("/logout", url.Values{}) }, release)
	release()
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("sign-out whose session row is locked past the bound: %d, want 503\n%s", rec.Code, rec.Body)
	}
	staff.h = b.e // the rest without the bound (a loaded machine under -race may pass 300 ms)
	page(t, staff.get("/account"), http.StatusOK)
	if n := b.audits(t, payments.AuditLogout, "ops@example.com"); n != 0 {
		t.Fatalf("%d logout entries for a session that still works", n)
	}
	// The same button once the row is free: signed out, and audited.
	page(t, staff.get("/account"), http.StatusOK)
	if rec := staff.post("/logout", url.Values{}); rec.Code != http.StatusSeeOther {
		t.Fatalf("sign-out: %d\n%s", rec.Code, rec.Body)
	}
	if rec := staff.get("/account"); rec.Code != http.StatusSeeOther {
		t.Fatalf("after sign-out /account: %d, want a redirect to the sign-in", rec.Code)
	}
	if n := b.audits(t, payments.AuditLogout, "ops@example.com"); n != 1 {
		t.Fatalf("%d logout entries, want 1", n)
	}
}
