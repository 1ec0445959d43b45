package payments

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// An apply whose transition is all that is left sends its COMMIT with the transition's batch
// (applyLocked's last). That is safe only because a refused guard fails in SQL, which makes the
// server skip the COMMIT: these tests make each guard refuse with the COMMIT riding along, and
// check that nothing of the transaction — not even what it wrote before — was committed, and that
// the caller is told the transaction did not commit. With the guards checked in Go (the old
// transition statement, or completion's RowsAffected check), the server committed before Go
// could object: the marker, and in the second test the transition, were committed.

// applyLyingAbout runs applyLocked in a transaction that first writes a marker on the order, with
// cur as the caller believes the session to be, and the COMMIT riding with the transition.
func applyLyingAbout(t *testing.T, svc *Service, cur Session, gp GatewayPayment) (mayHaveCommitted bool, err error) {
	t.Helper()
	ctx := context.Background()
	return svc.inTxCommit(ctx, "test apply", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET customer_contact = 'marker' WHERE order_id = $1`, cur.OrderID); err != nil {
			return err
		}
		_, err := svc.applyLocked(ctx, tx, Actor{Kind: ActorSweeper, ID: "test"}, cur, "", false, gp, "test", svc.Now(), nil, true)
		return err
	})
}

func seedSession(t *testing.T, svc *Service, order, status string, activeOnOrder bool) Session {
	t.Helper()
	ctx := context.Background()
	var id string
	if err := svc.db.QueryRow(ctx, `WITH o AS (INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, now(), now()))
		INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, gateway_payment_id, created_at, updated_at)
		VALUES (gen_random_uuid(), $1, 1000, 'EUR', $2, 'fake', 'gp-' || $1, now(), now()) RETURNING id::text`, order, status).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if activeOnOrder {
		if _, err := svc.db.Exec(ctx, `UPDATE orders SET active_session_id = $2 WHERE order_id = $1`, order, id); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := getSession(ctx, svc.db, id)
	if err != nil {
		t.Fatal(err)
	}
	return sess
}

func orderMarker(t *testing.T, svc *Service, order string) string {
	t.Helper()
	var m string
	if err := svc.db.QueryRow(context.Background(), `SELECT coalesce(customer_contact, '') FROM orders WHERE order_id = $1`, order).Scan(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRefusedTransitionSkipsTheCommitItCarried(t *testing.T) {
	svc, _, _ := tracedService(t, time.Second)
	sess := seedSession(t, svc, "refused-edge", "Failed", false)
	lie := sess
	lie.Status = StatusRegistered // the caller believes it may still complete
	may, err := applyLyingAbout(t, svc, lie, GatewayPayment{ID: sess.GatewayPaymentID, Status: GatewaySucceeded, Amount: 1000, Currency: "EUR"})
	var e *Error
	if !errors.As(err, &e) || e.Code != ECONFLICT || !strings.Contains(e.Message, "cannot go from Failed to Completed") {
		t.Fatalf("err = %v, want the conflict naming the current state", err)
	}
	if may {
		t.Error("the caller was told the transaction may have committed; the server refused before the COMMIT")
	}
	if m := orderMarker(t, svc, sess.OrderID); m != "" {
		t.Errorf("the transaction's earlier write was committed (marker %q) around a refused transition", m)
	}
	if got, _ := getSession(context.Background(), svc.db, sess.ID); got.Status != StatusFailed {
		t.Errorf("session is %s, want Failed", got.Status)
	}
}

func TestRefusedCompletionSkipsTheCommitItCarried(t *testing.T) {
	svc, _, _ := tracedService(t, time.Second)
	// The session may complete, but its order does not await payment through it (the pointer is
	// not set): the completion's guard refuses, after the transition already ran in the batch.
	sess := seedSession(t, svc, "refused-completion", "Registered", false)
	may, err := applyLyingAbout(t, svc, sess, GatewayPayment{ID: sess.GatewayPaymentID, Status: GatewaySucceeded, Amount: 1000, Currency: "EUR"})
	if err == nil || !strings.Contains(err.Error(), "invariant broken") {
		t.Fatalf("err = %v, want the completion's invariant", err)
	}
	if may {
		t.Error("the caller was told the transaction may have committed; the server refused before the COMMIT")
	}
	if m := orderMarker(t, svc, sess.OrderID); m != "" {
		t.Errorf("the transaction's earlier write was committed (marker %q) around a refused completion", m)
	}
	got, _ := getSession(context.Background(), svc.db, sess.ID)
	var entries int
	if err := svc.db.QueryRow(context.Background(), `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, sess.ID).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if got.Status != StatusRegistered || entries != 0 {
		t.Errorf("session %s with %d ledger entries committed; want Registered and none", got.Status, entries)
	}
}

// The guards' tests above are about the path where the COMMIT rides: here it does, and an apply
// that completes a payment is two round trips — the locks with the call's log row, then the
// transition, the order's completion and COMMIT — not three.
func TestApplyCommitsWithItsTransition(t *testing.T) {
	svc, _, log := tracedService(t, time.Second)
	sess := seedSession(t, svc, "rides", "Registered", true)
	log.reset()
	out, err := svc.applyOne(context.Background(), Actor{Kind: ActorSweeper, ID: "test"}, sess, "",
		GatewayPayment{ID: sess.GatewayPaymentID, Status: GatewaySucceeded, Amount: 1000, Currency: "EUR"}, "test")
	if err != nil || out.Status != StatusCompleted {
		t.Fatalf("apply: %s, %v; want Completed", out.Status, err)
	}
	log.mu.Lock()
	alone, batches := log.alone, log.batches
	log.mu.Unlock()
	if n := len(alone) + len(batches); n != 2 || len(batches) != 2 {
		t.Fatalf("apply took %d round trips (alone %q, pipelines %q), want 2 pipelines", n, alone, batches)
	}
	last := batches[1]
	if len(last) != 3 || !strings.Contains(last[0], "pitlane_transition_done") ||
		!strings.Contains(last[1], "pitlane_order_completed") || last[2] != "COMMIT" {
		t.Errorf("the last pipeline is %q, want the transition, the completion and COMMIT", last)
	}
	var entries int
	if err := svc.db.QueryRow(context.Background(), `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, sess.ID).Scan(&entries); err != nil || entries != 1 {
		t.Errorf("%d ledger entries committed (%v), want 1", entries, err)
	}
}
