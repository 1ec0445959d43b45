package handlers_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

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
		// The bound's words, with what to do (a statement the cut cancelled, SQLSTATE 57014, is
		// not "busy": a review of the session's diff found it answered so).
		if !strings.Contains(p.Detail, "did not answer in time") || !strings.Contains(p.Detail, "Idempotency-Key") {
			t.Fatalf("detail %q, want the bound's words", p.Detail)
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

// boundReplica is a replica over pool whose API calls are bounded at bound, with a stale bound
// of ten minutes (so only the cut, not the key's staleness, can end a key's last write), and the
// same replica without a bound, for the retries.
func (b *apiBench) boundReplica(pool *pgxpool.Pool, bound time.Duration, idem ...payments.IdempotencyConfig) (e, free *echo.Echo) {
	svc := payments.NewService(pool, payments.Config{Gateway: b.gw, Clock: b.clock, ReplicaID: "replica-bound",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Minute})
	keys := payments.IdempotencyConfig{StaleAfter: 10 * time.Minute}
	for _, c := range idem {
		keys.Hooks = c.Hooks
	}
	deps := web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, ReplicaID: "replica-bound", Payments: svc, Idempotency: keys}
	free = web.New(deps)
	deps.RequestTimeout = bound
	return web.New(deps), free
}

// A keyed call cut at its bound gives its key up within payments.RecordGrace of the cut, so its
// 503 is written before the server's write timeout: here the claim waits on a held lock, and
// when the cut frees the pool's only connection other work takes it before the key's Abandon.
// Before, the Abandon waited up to the stale bound (30 s in serve, past the write timeout's
// 10 s margin; ten minutes here) and the client got a dropped connection.
func TestKeyedCallCutAtItsBoundIsAnswered(t *testing.T) {
	t.Parallel()
	idem, letGone := letGo()
	b := newAPIBench(t)
	pool, take := poolOfOne(t, b.pool)
	e, free := b.boundReplica(pool, 2*time.Second, idem)
	release := holdCreateLock(t, b.pool, "o-cut-key")
	create := post(createPath("o-cut-key"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k-cut-key")
	answer := make(chan *httptest.ResponseRecorder, 1)
	go func() { answer <- b.on(e, create) }()
	waitBlockedOrAnswered(t, b, answer)
	var taken func()
	took := make(chan struct{})
	go func() { taken = take(); close(took) }() // queued for the connection before the key's Abandon
	rec := answered(t, "the keyed Create", func() *httptest.ResponseRecorder { return <-answer }, func() { <-took; taken() })
	if p := wantProblem(t, rec, http.StatusServiceUnavailable, ""); p.Code != payments.EUNAVAIL {
		t.Fatalf("problem %+v, want unavailable", p)
	}
	<-took
	taken()
	release()
	// The key's Abandon was given up within the grace and tried again in the background (it
	// stayed the request's until its stale bound, ten minutes here: an outside review, dbfail):
	// once that is written, the same request takes the key over.
	wantLetGo(t, letGone)
	wantPayment(t, b.on(free, create), http.StatusCreated)
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("%d registrations, want one", n)
	}
}

// A call whose gateway has answered records that answer within payments.RecordGrace of its cut:
// a Check whose database goes quiet (the pool's only connection taken) while the gateway answers
// is answered 503 instead of waiting as long as the database does, and the answer it gave up is
// the next look's. Before, the record ran under context.WithoutCancel alone (the gateway has
// spoken), outside the request's bound.
func TestCallCutAfterItsGatewayAnsweredIsAnswered(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	pool, take := poolOfOne(t, b.pool)
	e, free := b.boundReplica(pool, 2*time.Second)
	p := wantPayment(t, b.on(free, post(createPath("o-cut-check"), `{"amount":100,"currency":"EUR"}`)), http.StatusCreated)
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)
	gate := b.gw.Hold(fakegw.OpStatus)
	check := post("/api/v1/payments/"+p.ID+"/check", "")
	answer := make(chan *httptest.ResponseRecorder, 1)
	go func() { answer <- b.on(e, check) }()
	<-gate.Arrived()
	release := take() // the database goes quiet while the gateway answers
	gate.Open()
	rec := answered(t, "the Check", func() *httptest.ResponseRecorder { return <-answer }, release)
	if p := wantProblem(t, rec, http.StatusServiceUnavailable, ""); p.Code != payments.EUNAVAIL {
		t.Fatalf("problem %+v, want unavailable", p)
	}
	release()
	b.gw.Unhold(fakegw.OpStatus)
	if got := wantPayment(t, b.on(free, check), http.StatusOK); got.Status != string(payments.StatusCompleted) {
		t.Fatalf("after the quiet: %s, want Completed", got.Status)
	}
}
