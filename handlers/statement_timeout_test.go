package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/access"
	"pitlane/payments"
)

// A statement cut by the server's statement_timeout (an operator's ALTER ROLE … SET
// statement_timeout, or statement_timeout in DATABASE_URL) is a slow database, not a bug: the
// API answers 503 + Retry-After and the console its "try again" answer, as for a lock_timeout
// (an outside review: SQLSTATE 57014 was an internal error, 500). The order's row is held by
// another transaction (a slow Check of another replica) past a replica's 300 ms statement
// timeout, shorter than the core's lock_timeout. Negative control: lockTimedOut and dbError
// without 57014 answer 500 to both.
func TestAStatementTimeoutIsRetryableNotAServerError(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	ctx := context.Background()
	p := wantPayment(t, b.do(post(createPath("o-st"), `{"amount":100,"currency":"EUR"}`)), http.StatusCreated)
	if _, err := b.access.CreateUser(ctx, payments.Staff{}, "sup@example.com", access.RoleSupport, testPassword); err != nil {
		t.Fatal(err)
	}
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "300" // ms
	short, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(short.Close)
	_, e := b.server(t, short, "replica-short")
	staff := newAgent(t, e)
	staff.login("sup@example.com")

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = 'o-st' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	rec := b.on(e, post("/api/v1/payments/"+p.ID+"/check", ""))
	if pr := wantProblem(t, rec, http.StatusServiceUnavailable, ""); pr.Code != payments.EUNAVAIL || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("API Check cut by statement_timeout: %+v, Retry-After %q, want unavailable with Retry-After", pr, rec.Header().Get("Retry-After"))
	}
	if rec := staff.post("/payments/"+p.ID+"/check", nil); rec.Code >= http.StatusInternalServerError && rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("console Check cut by statement_timeout = %d, want the payment page's flash or 503 'try again'", rec.Code)
	}
}

// A client that hangs up while its request's statement waits (here: a Create's claim behind the
// order's lock) is a 499, not a server error and not "busy": pgx cancels the statement, and its
// 57014 reads as busy in the core (a review of the session's diff: it answered 503 "busy", and
// before that a 500). Negative control: the error handler's 499 without payments.QueryCanceled.
func TestAClientHangingUpMidStatementIs499(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	release := holdCreateLock(t, b.pool, "o-hang-up")
	defer release()
	ctx, hangUp := context.WithCancel(context.Background())
	req := b.request(post(createPath("o-hang-up"), `{"amount":100,"currency":"EUR"}`)).WithContext(ctx)
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		b.e.ServeHTTP(rec, req)
		answered <- rec
	}()
	waitBlockedOrAnswered(t, b, answered)
	hangUp()
	if rec := mustWait(t, answered, "the request"); rec.Code != 499 {
		t.Fatalf("a client gone while its statement waited: %d %s, want 499", rec.Code, rec.Body)
	}
}
