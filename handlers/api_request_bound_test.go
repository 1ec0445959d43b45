package handlers_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// answerWithin sends c to e and returns its answer; a request still unanswered after a minute
// (it waits as long as the database does) fails the test after release lets it end.
func (b *apiBench) answerWithin(t *testing.T, e http.Handler, c call, release func()) *httptest.ResponseRecorder {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, b.request(c))
		done <- rec
	}()
	select {
	case rec := <-done:
		return rec
	case <-time.After(time.Minute):
		release()
		<-done
		t.Fatalf("%s %s: no answer in a minute, the request waits as long as its database", c.method, c.path)
		return nil
	}
}

// An API call whose database does not answer is answered 503 (code "unavailable", Retry-After)
// within its bound, and the same request with its key works once the database answers again:
// one payment, one registration. Two ways a database goes quiet for a request: every connection
// of the pool taken (the key's look-up waits for one), and a lock that is never let go while the
// lock wait is long (the claim waits with the key taken: the key is given up, not left to go
// stale). Before, both requests waited as long as the database did, until the client gave up or
// the server's write timeout dropped the connection without an answer.
func TestAPIRequestWhoseDatabaseDoesNotAnswerIs503WithinItsBound(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	svc := payments.NewService(pool, payments.Config{Gateway: b.gw, Clock: b.clock, ReplicaID: "replica-bound",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Minute})
	deps := web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, ReplicaID: "replica-bound", Payments: svc}
	free := web.New(deps) // the same replica without the bound: the retries, on a loaded test machine too
	deps.RequestTimeout = 300 * time.Millisecond
	e := web.New(deps)
	const body = `{"amount":100,"currency":"EUR"}`
	want503 := func(rec *httptest.ResponseRecorder) {
		t.Helper()
		p := wantProblem(t, rec, http.StatusServiceUnavailable, "")
		if p.Code != payments.EUNAVAIL || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("problem %+v, Retry-After %q: want unavailable with Retry-After", p, rec.Header().Get("Retry-After"))
		}
	}

	held, err := pool.Acquire(ctx) // the pool's one connection, taken
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(held.Release) }
	defer release() // before pool.Close, which waits for it
	create := post(createPath("o-bound-pool"), body, "Idempotency-Key", "k-bound-pool")
	want503(b.answerWithin(t, e, create, release))
	release()
	wantPayment(t, b.on(free, create), http.StatusCreated)

	tx, err := b.pool.Begin(ctx) // the order's claim lock, held by another replica's transaction
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // released below
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(payments.LockCreateOrder), "o-bound-lock"); err != nil {
		t.Fatal(err)
	}
	create = post(createPath("o-bound-lock"), body, "Idempotency-Key", "k-bound-lock")
	want503(b.answerWithin(t, e, create, func() { _ = tx.Rollback(ctx) }))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wantPayment(t, b.on(free, create), http.StatusCreated)
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Fatalf("%d registrations, want one per order", n)
	}
}
