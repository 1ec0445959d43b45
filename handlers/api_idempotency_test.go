package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// 20 requests with one key, half through each of two replicas (two pools, two services, two
// Echo instances) over one database. The gateway holds the one registration that happens, so
// every other request provably runs while the first is in flight: each gets 409 + Retry-After.
// After it finishes, the key replays from either replica. One session, one registration.
func TestAPITwentyParallelRequestsOneKeyTwoReplicas(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	_, eB := b.server(t, testdb.Pool(t, b.url), "replica-b")
	gate := b.gw.Hold(fakegw.OpRegister)
	defer gate.Open()

	c := post(createPath("busy"), `{"amount":4200,"currency":"EUR"}`, "Idempotency-Key", "click-1")
	start := make(chan struct{})
	out := make(chan *httptest.ResponseRecorder, 20)
	var wg sync.WaitGroup
	for i := range 20 {
		e := b.e
		if i%2 == 1 {
			e = eB
		}
		r := b.request(c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, r)
			out <- rec
		}()
	}
	close(start)
	sessionID := mustWait(t, gate.Arrived(), "the key holder's registration at the gateway")
	for i := range 19 {
		rec := mustWait(t, out, fmt.Sprintf("concurrent request %d", i+1))
		wantProblem(t, rec, http.StatusConflict, "")
		if rec.Header().Get("Retry-After") == "" {
			t.Fatalf("409 without Retry-After")
		}
	}
	gate.Open()
	first := wantPayment(t, mustWait(t, out, "the key holder"), http.StatusCreated)
	wg.Wait()
	if first.ID != sessionID || first.Status != "Registered" {
		t.Fatalf("first = %+v, registered %s", first, sessionID)
	}
	for name, srv := range map[string]*echo.Echo{"replica a": b.e, "replica b": eB} {
		rec := b.on(srv, c)
		p := wantPayment(t, rec, http.StatusCreated)
		if p.ID != first.ID || rec.Header().Get("Idempotent-Replayed") != "true" || rec.Header().Get("Location") != "/api/v1/payments/"+first.ID {
			t.Fatalf("replay via %s = %+v %v", name, p, rec.Header())
		}
	}
	if n := b.sessions(t); n != 1 {
		t.Fatalf("sessions = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("registrations = %d", n)
	}
}

// A replay tells the current state: after a cancel, Canceled; after a capture, Completed. Never
// the stale Registered of the first answer. The first status code is kept.
func TestAPIReplayShowsCurrentState(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	canceled := post(createPath("to-cancel"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k-cancel")
	p := wantPayment(t, b.do(canceled), http.StatusCreated)
	if p.Status != "Registered" {
		t.Fatalf("first = %+v", p)
	}
	if rec := b.do(post("/api/v1/payments/"+p.ID+"/cancel", "")); rec.Code != http.StatusAccepted {
		t.Fatalf("cancel = %d", rec.Code)
	}
	var ch string
	if err := b.pool.QueryRow(context.Background(), `SELECT id::text FROM cancel_challenges WHERE session_id = $1`, p.ID).Scan(&ch); err != nil {
		t.Fatal(err)
	}
	wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/cancel/confirm", `{"challenge_id":"`+ch+`","code":"`+b.lastCode(t, p.ID)+`"}`)), http.StatusAccepted)
	rec := b.do(canceled)
	if r := wantPayment(t, rec, http.StatusCreated); r.ID != p.ID || r.Status != "Canceled" || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay after cancel = %+v %v", r, rec.Header())
	}

	completed := post(createPath("to-pay"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k-pay")
	p = wantPayment(t, b.do(completed), http.StatusCreated)
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)
	wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", "")), http.StatusOK)
	b.clock.Advance(29 * 24 * time.Hour) // still within the key's 30 days
	rec = b.do(completed)
	if r := wantPayment(t, rec, http.StatusCreated); r.ID != p.ID || r.Status != "Completed" || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay after capture = %+v", r)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Fatalf("registrations = %d, want 2", n)
	}
}

// The same key with another request is 422 — another body, or the same body for another order —
// and the key still replays its own request afterwards.
func TestAPIReplayWithAnotherRequestIs422(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	first := wantPayment(t, b.do(post(createPath("o-1"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k")), http.StatusCreated)
	wantProblem(t, b.do(post(createPath("o-1"), `{"amount":101,"currency":"EUR"}`, "Idempotency-Key", "k")), http.StatusUnprocessableEntity, "Idempotency-Key")
	wantProblem(t, b.do(post(createPath("o-2"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k")), http.StatusUnprocessableEntity, "Idempotency-Key")
	// Whitespace and member order do not make another request: the body is canonical.
	rec := b.do(post(createPath("o-1"), "{ \"currency\" : \"EUR\",\n \"amount\": 100 }", "Idempotency-Key", "k"))
	if p := wantPayment(t, rec, http.StatusCreated); p.ID != first.ID || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("canonical replay = %+v", p)
	}
	if n := b.sessions(t); n != 1 {
		t.Fatalf("sessions = %d", n)
	}
}

// Failures before any effect do not burn the key: after a validation error, or a 409 conflict,
// the same key serves a corrected request.
func TestAPIFailuresBeforeEffectDoNotBurnTheKey(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	wantProblem(t, b.do(post(createPath("o"), `{"amount":0,"currency":"EUR"}`, "Idempotency-Key", "k1")), http.StatusUnprocessableEntity, "amount")
	wantPayment(t, b.do(post(createPath("o"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k1")), http.StatusCreated)

	// o has an active 100 EUR session: 200 EUR with k2 is a conflict, and k2 stays free.
	wantProblem(t, b.do(post(createPath("o"), `{"amount":200,"currency":"EUR"}`, "Idempotency-Key", "k2")), http.StatusConflict, "")
	rec := b.do(post(createPath("other"), `{"amount":200,"currency":"EUR"}`, "Idempotency-Key", "k2"))
	if p := wantPayment(t, rec, http.StatusCreated); p.OrderID != "other" || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("k2 after a conflict = %+v %v", p, rec.Header())
	}
	// An unauthenticated request never reaches a key.
	wantProblem(t, b.do(post(createPath("z"), `{"amount":1,"currency":"EUR"}`, "Idempotency-Key", "k3", "Authorization", "Bearer nope")), http.StatusUnauthorized, "")
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE kind = 'key'`); n != 2 {
		t.Fatalf("keys = %d, want k1 and k2", n)
	}
}

// Keys of client A are invisible to client B: the same key string names two keys.
func TestAPIKeysOfOneClientInvisibleToAnother(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	_, keyB, err := b.access.CreateAPIClient(context.Background(), payments.Staff{Email: "test@example.com", Role: "admin"}, "other shop")
	if err != nil {
		t.Fatal(err)
	}
	asB := func(c call) call { c.headers["Authorization"] = "Bearer " + keyB; return c }
	pa := wantPayment(t, b.do(post(createPath("a-order"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "shared")), http.StatusCreated)
	// B's request with the same key and another body is not A's key's "other request" (no 422),
	// and B's request with A's exact body is not a replay of A's session.
	pb := wantPayment(t, b.do(asB(post(createPath("b-order"), `{"amount":300,"currency":"USD"}`, "Idempotency-Key", "shared"))), http.StatusCreated)
	rec := b.do(asB(post(createPath("a-order"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "shared")))
	wantProblem(t, rec, http.StatusUnprocessableEntity, "Idempotency-Key") // B's own key, bound to B's request
	if pb.ID == pa.ID {
		t.Fatal("B got A's session")
	}
	rec = b.do(post(createPath("a-order"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "shared"))
	if p := wantPayment(t, rec, http.StatusCreated); p.ID != pa.ID || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("A's replay = %+v", p)
	}
}

// A request that dies mid-way (here: parked forever right before the gateway call, with its
// session claimed) keeps its key 409 until the stale bound passes; then the same request takes
// the key over, and the core's per-order claim hands it the session the dead one claimed: still
// one session, one registration.
func TestAPICrashedRequestKeyTakenOverAfterStaleBound(t *testing.T) {
	t.Parallel()
	p := newParker()
	b := newAPIBench(t, benchOpt{
		core: func(c *payments.Config) { c.Hooks.BeforeRegister = p.hook },
		idem: payments.IdempotencyConfig{StaleAfter: payments.StaleAfterFor(10 * time.Second)},
	})
	c := post(createPath("o"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k")
	dead := b.goDo(b.e, c)
	claimed := mustWait(t, p.arrived, "the first request's claim")

	b.clock.Advance(29 * time.Second)
	rec := b.do(c)
	wantProblem(t, rec, http.StatusConflict, "")
	if rec.Header().Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	b.clock.Advance(2 * time.Second) // past 2 x 10 s + 10 s
	// The key's request created the session and its answer was never recorded: answered as
	// that request would have, 202 while Registering (200 said "already existed").
	rec = b.do(c)
	if got := wantPayment(t, rec, http.StatusAccepted); got.ID != claimed || got.Status != "Registering" {
		t.Fatalf("takeover = %+v, want the claimed session %s", got, claimed)
	}
	rec = b.do(c)
	if got := wantPayment(t, rec, http.StatusAccepted); got.ID != claimed || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay after takeover = %+v", got)
	}
	// The "dead" request wakes up 31 s after its claim, past the patrol's grace for the
	// session (RegisterGrace, 30 s): it sends nothing beside the patrol (202, Registering) and
	// cannot complete the key. The patrol registers the session once.
	p.release <- struct{}{}
	if got := wantPayment(t, mustWait(t, dead, "the first request"), http.StatusAccepted); got.ID != claimed || got.Status != "Registering" {
		t.Fatalf("first = %+v", got)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 0 {
		t.Fatalf("registrations by the late request = %d", n)
	}
	if _, err := b.svc.SweepOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := b.sessions(t); n != 1 {
		t.Fatalf("sessions = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("registrations = %d", n)
	}
}

// A client key's request that fails after its claim committed (here the database goes away
// between the claim and the registration's apply: 503) leaves the key bound to the session it
// created. When the same request comes again, after the key's stale bound and after the patrol
// found the payment declined, it replays that session as it is now (Failed, Idempotent-Replayed)
// — not a second session and a second registration under the same key, which is what running
// Create again gave (the main before this change: 201 with a new session). Found by a review of
// the database answering late.
func TestAPIClientKeyReplaysTheSessionItsFailedRequestCreated(t *testing.T) {
	t.Parallel()
	var cut func(t *testing.T)
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) {
		c.Hooks.BeforeRegister = func(context.Context, string) {
			if f := cut; f != nil { // b.do runs in the test's goroutine
				cut = nil
				f(t)
			}
		}
	}})
	var db string
	if err := b.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	var restore func()
	cut = func(t *testing.T) { restore = outage(t, db) }
	c := post(createPath("o-k"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "k-cut")
	wantProblem(t, b.do(c), http.StatusServiceUnavailable, "")
	restore()
	var first string
	if err := b.pool.QueryRow(context.Background(), `SELECT id::text FROM payment_sessions WHERE order_id = 'o-k'`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	// The patrol recovers the session after its grace and finds it declined at the gateway.
	b.clock.Advance(31 * time.Second)
	gp, err := b.gw.Register(context.Background(), payments.RegisterRequest{IdempotencyKey: first, Reference: first, Amount: 100, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(gp.ID, payments.GatewayDeclined)
	if _, err := b.svc.SweepOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := b.do(c)
	// As the request that created it would have answered (201: the gateway has it, or refused
	// it), its first answer never recorded.
	if p := wantPayment(t, rec, http.StatusCreated); p.ID != first || p.Status != "Failed" || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the same request again = %+v %v, want the session %s it created, replayed", p, rec.Header(), first)
	}
	if n := b.sessions(t); n != 1 {
		t.Fatalf("sessions = %d, want 1", n)
	}
}

// No key: five quick retries are one intent → one session; an honest new attempt an hour later,
// after the first was declined, is a new intent → a new session.
func TestAPIIntentKeysWithoutIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	c := post(createPath("o"), `{"amount":1500,"currency":"EUR"}`)
	first := wantPayment(t, b.do(c), http.StatusCreated)
	for i := range 4 {
		b.clock.Advance(10 * time.Second)
		if p := wantPayment(t, b.do(c), http.StatusOK); p.ID != first.ID {
			t.Fatalf("retry %d = %+v", i+1, p)
		}
	}
	if n := b.sessions(t); n != 1 {
		t.Fatalf("sessions = %d", n)
	}
	// The bank declines.
	b.gw.SetStatus(*first.GatewayPaymentID, payments.GatewayDeclined)
	if p := wantPayment(t, b.do(post("/api/v1/payments/"+first.ID+"/check", "")), http.StatusOK); p.Status != "Failed" {
		t.Fatalf("after decline = %+v", p)
	}
	// A retry still inside the window: the intent's session is over and the order has nothing
	// active, so the contract's 200 ("an active session ... exists") has nothing to answer
	// with: a new attempt (201), not the declined session for as long as retries keep the
	// window open.
	b.clock.Advance(time.Minute)
	rec := b.do(c)
	second := wantPayment(t, rec, http.StatusCreated)
	if second.ID == first.ID || second.Status != "Registered" || rec.Header().Get("Idempotent-Replayed") != "" ||
		rec.Header().Get("Location") != "/api/v1/payments/"+second.ID {
		t.Fatalf("retry after decline in the window = %+v %v", second, rec.Header())
	}
	// Its own retries: the one new attempt, 200.
	for range 2 {
		b.clock.Advance(10 * time.Second)
		if p := wantPayment(t, b.do(c), http.StatusOK); p.ID != second.ID {
			t.Fatalf("retry of the new attempt = %+v, want %s", p, second.ID)
		}
	}
	// An hour later: a new intent; the order's active session has the same parameters.
	b.clock.Advance(time.Hour)
	if p := wantPayment(t, b.do(c), http.StatusOK); p.ID != second.ID {
		t.Fatalf("an hour later = %+v, want %s", p, second.ID)
	}
	if n := b.sessions(t); n != 2 {
		t.Fatalf("sessions = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Fatalf("registrations = %d", n)
	}
}

// A keyless Create of an order its intent's session paid, inside the window: the contract's
// "409 the order is already paid", as after the window — not a 200 with the Completed session
// (the contract's 200 is "an active session ... exists"). Only a client's own key replays it.
func TestAPIKeylessCreateOfAPaidOrderIs409(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	c := post(createPath("o-paid"), `{"amount":1500,"currency":"EUR"}`)
	first := wantPayment(t, b.do(c), http.StatusCreated)
	b.gw.SetStatus(*first.GatewayPaymentID, payments.GatewaySucceeded)
	if p := wantPayment(t, b.do(post("/api/v1/payments/"+first.ID+"/check", "")), http.StatusOK); p.Status != "Completed" {
		t.Fatalf("after capture = %+v", p)
	}
	b.clock.Advance(time.Minute)
	rec := b.do(c)
	if p := wantProblem(t, rec, http.StatusConflict, ""); !strings.Contains(p.Detail, "already paid") || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("keyless create of the paid order = %+v %v", p, rec.Header())
	}
	if n := b.sessions(t); n != 1 {
		t.Fatalf("sessions = %d", n)
	}

	// The same when the intent's session was declined and another request (with a key of its
	// own) paid the order inside the window.
	c = post(createPath("o-paid-by-another"), `{"amount":1500,"currency":"EUR"}`)
	declined := wantPayment(t, b.do(c), http.StatusCreated)
	b.gw.SetStatus(*declined.GatewayPaymentID, payments.GatewayDeclined)
	wantPayment(t, b.do(post("/api/v1/payments/"+declined.ID+"/check", "")), http.StatusOK)
	paid := wantPayment(t, b.do(post(createPath("o-paid-by-another"), `{"amount":1500,"currency":"EUR"}`, "Idempotency-Key", "next")), http.StatusCreated)
	b.gw.SetStatus(*paid.GatewayPaymentID, payments.GatewaySucceeded)
	wantPayment(t, b.do(post("/api/v1/payments/"+paid.ID+"/check", "")), http.StatusOK)
	b.clock.Advance(time.Minute)
	if p := wantProblem(t, b.do(c), http.StatusConflict, ""); !strings.Contains(p.Detail, "already paid") {
		t.Fatalf("keyless create of the order paid by another request = %+v", p)
	}
}

// A keyless retry whose intent's session was declined, while another request already started
// the order's next payment with the same amount and currency (here with a key of its own):
// the retry answers that active session (the contract's 200: "an active session with the same
// amount and currency already exists"), not the declined one it first created.
func TestAPIIntentReplayPrefersTheOrdersActiveSession(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	c := post(createPath("o-next"), `{"amount":300,"currency":"EUR"}`)
	first := wantPayment(t, b.do(c), http.StatusCreated)
	b.gw.SetStatus(*first.GatewayPaymentID, payments.GatewayDeclined)
	wantPayment(t, b.do(post("/api/v1/payments/"+first.ID+"/check", "")), http.StatusOK)
	b.clock.Advance(10 * time.Second)
	next := wantPayment(t, b.do(post(createPath("o-next"), `{"amount":300,"currency":"EUR"}`, "Idempotency-Key", "next-attempt")), http.StatusCreated)
	b.clock.Advance(10 * time.Second)
	rec := b.do(c)
	if p := wantPayment(t, rec, http.StatusOK); p.ID != next.ID || p.Status != "Registered" {
		t.Fatalf("keyless retry = %s %s, want the active %s", p.ID, p.Status, next.ID)
	}
	if rec.Header().Get("Idempotent-Replayed") != "" || rec.Header().Get("Location") != "/api/v1/payments/"+next.ID {
		t.Fatalf("headers = %v", rec.Header())
	}
	if n := b.sessions(t); n != 2 {
		t.Fatalf("sessions = %d, want 2", n)
	}
}

// A keyless retry whose intent's session was declined, while the order has an active session
// with other parameters (started by another keyless request): the contract's 409, not a 200
// with the declined session.
func TestAPIIntentReplayOfAnEndedSessionMeetsTheOrdersOtherSession(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	c := post(createPath("o-other"), `{"amount":300,"currency":"EUR"}`)
	first := wantPayment(t, b.do(c), http.StatusCreated)
	b.gw.SetStatus(*first.GatewayPaymentID, payments.GatewayDeclined)
	wantPayment(t, b.do(post("/api/v1/payments/"+first.ID+"/check", "")), http.StatusOK)
	b.clock.Advance(10 * time.Second)
	wantPayment(t, b.do(post(createPath("o-other"), `{"amount":301,"currency":"EUR"}`)), http.StatusCreated)
	b.clock.Advance(10 * time.Second)
	if p := wantProblem(t, b.do(c), http.StatusConflict, ""); !strings.Contains(p.Detail, "already has an active payment") {
		t.Fatalf("keyless retry of the declined intent = %+v", p)
	}
	if n := b.sessions(t); n != 2 {
		t.Fatalf("sessions = %d, want 2", n)
	}
}

// Identical keyless retries of a declined intent that arrive together: one new attempt, every
// answer the one session (201 or 200), never a 409 (contract: "Keyless requests"). The first
// retry is parked inside its claim (order row and advisory lock held) until every other one is
// seen waiting for it in pg_locks; then they meet the new session in the core's claim.
func TestAPIIntentRetriesOfAnEndedSessionTogetherMakeOneAttempt(t *testing.T) {
	t.Parallel()
	p := newParker()
	var armed atomic.Bool
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) {
		c.Hooks.AfterClaimRead = func(ctx context.Context, order string) {
			if armed.CompareAndSwap(true, false) { // the first retry's claim only
				p.hook(ctx, order)
			}
		}
	}})
	t.Cleanup(func() { p.release <- struct{}{} }) // a failed run must not leave it parked
	c := post(createPath("o-burst"), `{"amount":700,"currency":"EUR"}`)
	first := wantPayment(t, b.do(c), http.StatusCreated)
	b.gw.SetStatus(*first.GatewayPaymentID, payments.GatewayDeclined)
	wantPayment(t, b.do(post("/api/v1/payments/"+first.ID+"/check", "")), http.StatusOK)
	b.clock.Advance(time.Minute)

	const n = 6
	armed.Store(true)
	answers := []<-chan *httptest.ResponseRecorder{b.goDo(b.e, c)}
	mustWait(t, p.arrived, "the first retry inside its claim")
	for range n - 1 {
		answers = append(answers, b.goDo(b.e, c))
	}
	waitLockWaiters(t, b, n-1)
	p.release <- struct{}{}
	ids := map[string]int{}
	for _, a := range answers {
		rec := mustWait(t, a, "a retry's answer")
		if rec.Code != http.StatusCreated && rec.Code != http.StatusOK {
			t.Fatalf("a retry answered %d %s", rec.Code, rec.Body.String())
		}
		ids[wantPayment(t, rec, rec.Code).ID]++
	}
	if len(ids) != 1 || ids[first.ID] != 0 {
		t.Fatalf("retries answered %v, want one new session", ids)
	}
	if got := b.sessions(t); got != 2 {
		t.Fatalf("sessions = %d, want 2", got)
	}
	if got := b.gw.Calls(fakegw.OpRegister); got != 2 {
		t.Fatalf("registrations = %d, want 2", got)
	}
}

// The gateway refuses to register the order's payment (an amount over its limit, a risk rule):
// the session is Failed inside the first request. Identical keyless retries of the burst all
// came after it, and each made a new session and a new registration the gateway refused again
// (contract: identical keyless Creates answer "with the one session"). The refused session is
// the intent's answer while the window is open (200), as a refused refund is; a new key, or the
// window's end, tries again; and whichever API client asks. From the contract and apikeys
// reviews; negative control: without CreateInput.RefusedStands, 201 and a new session each time.
func TestAPIKeylessRetriesOfARefusedRegistrationAreTheOneSession(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 2)
	c := post(createPath("o-refused"), `{"amount":100,"currency":"EUR"}`)
	first := wantPayment(t, b.do(c), http.StatusCreated)
	if first.Status != "Failed" || first.GatewayPaymentID != nil {
		t.Fatalf("setup: the refused registration is %s %v", first.Status, first.GatewayPaymentID)
	}
	for i := range 2 {
		if p := wantPayment(t, b.do(c), http.StatusOK); p.ID != first.ID {
			t.Fatalf("retry %d answered %s, want the refused session %s", i+1, p.ID, first.ID)
		}
	}
	// The same keyless Create from another API client of the shop (its second service, a key
	// rotation half-way: the apikeys review) is the one session too: the core decides it.
	_, other, err := b.access.CreateAPIClient(context.Background(), payments.Staff{Email: "test@example.com", Role: "admin"}, "shop, new key")
	if err != nil {
		t.Fatal(err)
	}
	c2 := post(createPath("o-refused"), `{"amount":100,"currency":"EUR"}`)
	c2.headers["Authorization"] = "Bearer " + other
	if p := wantPayment(t, b.do(c2), http.StatusOK); p.ID != first.ID {
		t.Fatalf("the other client's retry answered %s, want the refused session %s", p.ID, first.ID)
	}
	if n, r := b.sessions(t), b.gw.Calls(fakegw.OpRegister); n != 1 || r != 1 {
		t.Fatalf("%d sessions, %d registrations; want 1 and 1", n, r)
	}
	// A key of its own is a new attempt (the gateway refuses it once more).
	if p := wantPayment(t, b.do(post(createPath("o-refused"), `{"amount":100,"currency":"EUR"}`, "Idempotency-Key", "again")), http.StatusCreated); p.ID == first.ID {
		t.Fatal("a keyed Create answered the refused session")
	}
	// After 5 quiet minutes the same operation is a new intent: a new attempt.
	b.clock.Advance(payments.DefaultIntentWindow + time.Second)
	if p := wantPayment(t, b.do(c), http.StatusCreated); p.ID == first.ID || p.Status != "Registered" {
		t.Fatalf("after the window: %s %s, want a new registered session", p.ID, p.Status)
	}
}

// waitLockWaiters waits until want backends of the bench's database wait for a lock.
func waitLockWaiters(t *testing.T, b *apiBench, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if lockWaiters(t, b) >= want {
			return
		}
	}
	t.Fatalf("fewer than %d requests ever waited for a lock", want)
}

// No key, while the first request of an intent is still at the gateway: a retry gets the
// claimed session (the contract's 200 for "an active session with the same parameters exists"),
// never a second one; a request with other parameters gets 409. The retry is answered from the
// intent key, which the first request's claim completed with its session (Idempotent-Replayed):
// it runs no Create of its own. Completed after the Create instead, the key would still be held
// here, and the retry would go through the core's claim.
func TestAPIIntentInFlight(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	gate := b.gw.Hold(fakegw.OpRegister)
	defer gate.Open()
	c := post(createPath("o"), `{"amount":1500,"currency":"EUR"}`)
	first := b.goDo(b.e, c)
	claimed := mustWait(t, gate.Arrived(), "the first registration")

	rec := b.do(c)
	if p := wantPayment(t, rec, http.StatusOK); p.ID != claimed || p.Status != "Registering" || rec.Header().Get("Location") != "/api/v1/payments/"+claimed {
		t.Fatalf("retry in flight = %+v", p)
	}
	if rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("the retry in flight was not answered from the intent key: it ran a Create of its own")
	}
	var resource string
	if err := b.pool.QueryRow(context.Background(), `SELECT resource_id::text FROM idempotency_keys
		WHERE kind = 'intent' AND completed_at IS NOT NULL`).Scan(&resource); err != nil || resource != claimed {
		t.Fatalf("while the first request is at the gateway, its intent key points at %q (%v), want %s", resource, err, claimed)
	}
	wantProblem(t, b.do(post(createPath("o"), `{"amount":1600,"currency":"EUR"}`)), http.StatusConflict, "")
	gate.Open()
	if p := wantPayment(t, mustWait(t, first, "first"), http.StatusCreated); p.ID != claimed {
		t.Fatalf("first = %+v", p)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("registrations = %d", n)
	}
}

// No key, across a clock boundary: a Create at 12:04:59 and its retry at 12:05:01 are one intent
// — the retry is answered from the intent key (Idempotent-Replayed), without a claim of its own
// (the main before this change started a new intent at 12:05:00). Five quiet minutes later the
// retry is a new intent: the core's answer, the same active session, 200, no replay header.
func TestAPIKeylessCreateAcrossAClockBoundaryIsOneIntent(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	c := post(createPath("o-boundary"), `{"amount":1500,"currency":"EUR"}`)
	b.clock.Set(t0.Add(4*time.Minute + 59*time.Second))
	first := wantPayment(t, b.do(c), http.StatusCreated)
	b.clock.Advance(2 * time.Second)
	rec := b.do(c)
	if p := wantPayment(t, rec, http.StatusOK); p.ID != first.ID || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry at 12:05:01 = %+v %v, want the intent's replay", p, rec.Header())
	}
	b.clock.Advance(5*time.Minute + payments.IntentGraceFor(0)) // and the grace of a request that read its time inside the window
	rec = b.do(c)
	if p := wantPayment(t, rec, http.StatusOK); p.ID != first.ID || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("five quiet minutes (and the grace) later = %+v %v, want a new intent answered by the core", p, rec.Header())
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("registrations = %d, want 1", n)
	}
}

// Identical keyless Creates for one order never get 409 (contract: "Keyless requests"). The
// interleaving that gave [201, 409]: the first request holds the intent and is inside its claim,
// parked right after reading "no active session" (AfterClaimRead, the per-order advisory lock
// held); the duplicate arrives. It must wait for the claim (seen waiting in pg_locks), then get
// the first's session with 200, without a claim of its own. One session, one registration.
func TestAPIKeylessIdenticalCreatesNeverConflict(t *testing.T) {
	t.Parallel()
	p := newParker()
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) { c.Hooks.AfterClaimRead = p.hook }})
	t.Cleanup(func() { // a failed run must not leave a request parked holding a connection
		for range 4 {
			p.release <- struct{}{}
		}
	})
	c := post(createPath("o-burst"), `{"amount":1500,"currency":"EUR"}`)
	first := b.goDo(b.e, c)
	mustWait(t, p.arrived, "the first request inside its claim")
	// The negative control: what the main's rule (answer from what is visible now: an active
	// session with these parameters, else 409) says at this very point.
	if got := naiveInFlightAnswer(t, b, "o-burst", 1500, "EUR"); got != http.StatusConflict {
		t.Fatalf("the naive rule at the parked point = %d; the interleaving is not the one that gave 409", got)
	}
	second := b.goDo(b.e, c)
	waitBlockedOrAnswered(t, b, second)
	p.release <- struct{}{}
	// The first commits its claim; the duplicate, waiting for it on the order's lock (taken
	// shared), reads the committed session without a claim of its own.
	r1 := wantPayment(t, mustWait(t, first, "first"), http.StatusCreated)
	r2 := wantPayment(t, mustWait(t, second, "duplicate"), http.StatusOK)
	if r1.ID != r2.ID {
		t.Fatalf("two sessions: %s and %s", r1.ID, r2.ID)
	}
	if n := b.sessions(t); n != 1 {
		t.Fatalf("sessions = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("registrations = %d", n)
	}
}

// naiveInFlightAnswer is the main's rule for a keyless duplicate whose intent is still held: the
// active session with the same parameters if one is visible (200), otherwise 409.
func naiveInFlightAnswer(t *testing.T, b *apiBench, order string, amount int64, currency string) int {
	t.Helper()
	_, sessions, err := b.svc.GetOrder(context.Background(), order)
	if err != nil && payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatal(err)
	}
	for _, s := range sessions {
		if s.Status.Active() && s.Amount == amount && s.Currency == currency {
			return http.StatusOK
		}
	}
	return http.StatusConflict
}

// waitBlockedOrAnswered waits until a backend of the bench's database waits for a lock, failing at
// once if the request answers first (it did not wait for the claim).
func waitBlockedOrAnswered(t *testing.T, b *apiBench, rec <-chan *httptest.ResponseRecorder) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case r := <-rec:
			t.Fatalf("the duplicate answered %d without waiting for the claim: %s", r.Code, r.Body)
		default:
		}
		if lockWaiters(t, b) > 0 {
			return
		}
	}
	t.Fatal("the duplicate never waited for a lock")
}

// lockWaiters is how many backends of the bench's database wait for a lock (by the waiting
// backend's database: a row lock's wait, a transactionid lock, names none).
func lockWaiters(t *testing.T, b *apiBench) int {
	t.Helper()
	var waiting int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE NOT l.granted AND a.datname = current_database()`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	return waiting
}
