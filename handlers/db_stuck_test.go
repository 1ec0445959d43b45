package handlers_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments"
)

// stuckHolder is what a replica that died (host lost, network cut) in the middle of a core
// transaction leaves behind: a backend idle in transaction holding the order → session locks,
// until PostgreSQL notices the client is gone (tcp keepalive, by default two hours).
func stuckHolder(t *testing.T, url, orderID, sessionID string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = $1 FOR UPDATE`, orderID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM payment_sessions WHERE id = $1 FOR UPDATE`, sessionID); err != nil {
		t.Fatal(err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			tx.Rollback(ctx)
			conn.Close(ctx)
		}
	}
	t.Cleanup(release)
	return release
}

// waiting lists what the database's other backends wait for right now (for the failure message).
func waiting(t *testing.T, url string) []string {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT coalesce(wait_event_type,'') || ' ' || left(regexp_replace(query, '\s+', ' ', 'g'), 90)
		FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`)
	out, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	return out
}

// A Check of a payment whose order and session rows are held by a transaction that will not end
// (its replica died mid-transaction) is promised a bounded lock wait: lock_timeout, then 503 with
// Retry-After ("every lock wait is bounded by lock_timeout"; a lock timeout is EUNAVAIL). The
// Check's apply does time out — but then the call's log row is written on its own
// (deferCallLog's flush → writeCallLog), an autocommit INSERT on a detached context with no
// lock_timeout, whose foreign key to payment_sessions waits for KEY SHARE on the held session row:
// the request hangs for as long as the dead transaction holds it, ignoring the client's hang-up
// (an outside review, database failures). writeCallLog now runs under the same bounded lock wait.
// Negative control: the autocommit insert back, no answer within 10 s.
func TestACheckBehindADeadTransactionAnswers503(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) { c.LockTimeout = 200 * time.Millisecond }})
	p := wantPayment(t, b.do(post(createPath("o-stuck"), `{"amount":500,"currency":"EUR"}`)), http.StatusCreated)
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)
	stuckHolder(t, b.url, "o-stuck", p.ID)

	done := b.goDo(b.e, post("/api/v1/payments/"+p.ID+"/check", ""))
	select {
	case rec := <-done:
		pr := wantProblem(t, rec, http.StatusServiceUnavailable, "")
		if pr.Code != payments.EUNAVAIL || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("problem %+v, Retry-After %q", pr, rec.Header().Get("Retry-After"))
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the Check has not answered 10 s after its 200 ms lock_timeout; waiting in the database: %q", waiting(t, b.url))
	}
}

// The same stuck transaction against the patrol: a due session is claimed by this replica's
// patrol, and while its drive asks the gateway, another replica (a Check request) takes the
// payment's order → session locks and dies mid-transaction. The drive's apply times out on its
// lock as it should, but its call-log flush then waits without bound (no lock_timeout, detached
// context), so the round never ends — and a stop (SIGTERM: the round's context cancelled) does not
// end it either: the replica neither finishes its round nor gives its lease back, and its
// shutdown hangs until the unit's stop timeout kills it (operations.md "Stopping a replica":
// drives in flight are cut and their leases given back). Fixed with the Check's (writeCallLog's
// bounded wait); negative control: the autocommit insert back, the round has not ended.
func TestAPatrolRoundBehindADeadTransactionEnds(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) { c.LockTimeout = 200 * time.Millisecond }})
	ctx := context.Background()
	stuck := wantPayment(t, b.do(post(createPath("o-stuck"), `{"amount":500,"currency":"EUR"}`)), http.StatusCreated)
	b.gw.SetStatus(*stuck.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET next_check_at = $1`, t0.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	gate := b.gw.Hold("status")
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 1)
	go func() { _, err := b.svc.PatrolRound(rctx); ended <- err }()
	mustWait(t, gate.Arrived(), "the drive's status call")
	stuckHolder(t, b.url, "o-stuck", stuck.ID) // the other replica's dead transaction
	gate.Open()

	// Wait (on the database, not on time) until the drive waits for its call-log insert, then stop
	// the replica (SIGTERM); a round that ended by itself first (its waits bounded) is as good.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	guard := time.After(20 * time.Second)
	for seen := false; !seen; {
		select {
		case <-tick.C:
			for _, w := range waiting(t, b.url) {
				seen = seen || strings.Contains(w, "INSERT INTO gateway_calls")
			}
		case <-ended:
			return
		case <-guard:
			t.Fatalf("the round neither ended nor reached the call log; waiting: %q", waiting(t, b.url))
		}
	}
	stop() // SIGTERM
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatalf("the patrol round has not ended 10 s after its stop (its drive's lock wait was bounded at 200 ms); "+
			"leases still held: %d; waiting in the database: %q",
			b.count(t, `SELECT count(*) FROM payment_sessions WHERE lease_token IS NOT NULL`), waiting(t, b.url))
	}
}

func TestALockTimeoutOnACodeIs503(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) { c.LockTimeout = 200 * time.Millisecond }})
	ctx := context.Background()
	p := wantPayment(t, b.do(post(createPath("o-c"), `{"amount":500,"currency":"EUR"}`)), http.StatusCreated)
	rec := b.do(post("/api/v1/payments/"+p.ID+"/cancel", ""))
	if rec.Code != http.StatusAccepted {
		t.Fatalf("cancel: %d %s", rec.Code, rec.Body)
	}
	ch := decode[struct {
		ChallengeID string `json:"challenge_id"`
	}](t, rec)
	code := b.lastCode(t, p.ID)
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM cancel_challenges WHERE id = $1 FOR UPDATE`, ch.ChallengeID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []call{
		post("/api/v1/payments/"+p.ID+"/cancel/confirm", `{"challenge_id":"`+ch.ChallengeID+`","code":"`+code+`"}`),
		post("/api/v1/payments/"+p.ID+"/cancel", ""),
	} {
		rec := b.do(c)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s %s behind a held challenge row: %d (Retry-After %q) %s, want 503 with Retry-After",
				c.method, c.path, rec.Code, rec.Header().Get("Retry-After"), rec.Body)
		}
	}
	tx.Rollback(ctx)
}
