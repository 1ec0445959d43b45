package handlers_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// answerWithin sends c to e and returns its answer (answered: a minute at most).
func (b *apiBench) answerWithin(t *testing.T, e http.Handler, c call, release func()) *httptest.ResponseRecorder {
	t.Helper()
	return answered(t, c.method+" "+c.path, func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, b.request(c))
		return rec
	}, release)
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
	pool, take := poolOfOne(t, b.pool)
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

	release := take()
	create := post(createPath("o-bound-pool"), body, "Idempotency-Key", "k-bound-pool")
	want503(b.answerWithin(t, e, create, release))
	release()
	wantPayment(t, b.on(free, create), http.StatusCreated)

	release = holdCreateLock(t, b.pool, "o-bound-lock")
	create = post(createPath("o-bound-lock"), body, "Idempotency-Key", "k-bound-lock")
	want503(b.answerWithin(t, e, create, release))
	release()
	wantPayment(t, b.on(free, create), http.StatusCreated)
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Fatalf("%d registrations, want one per order", n)
	}
}
