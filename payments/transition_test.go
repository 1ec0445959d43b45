package payments

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/internal/testdb"
)

// Every edge of the table is tried from every state: allowed edges apply (one row, one timeline
// event), every other one is refused with ECONFLICT and changes nothing.
func TestEveryTransitionEdge(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	actor := Actor{Kind: ActorSystem, ID: "edge-test"}
	for _, from := range AllStatuses {
		for _, to := range AllStatuses {
			t.Run(fmt.Sprintf("%s->%s", from, to), func(t *testing.T) {
				orderID := "edge-" + uuid.NewString()[:8]
				id := uuid.NewString()
				if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, $2, $2)`, orderID, now); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, created_at, updated_at)
					VALUES ($1, $2, 100, 'EUR', $3, 'fake', $4, $4)`, id, orderID, string(from), now); err != nil {
					t.Fatal(err)
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				sess, err := applyTransition(ctx, tx, id, to, actor, "edge test", now, sessionPatch{})
				allowed := CanTransition(from, to)
				if allowed {
					if err != nil {
						t.Fatalf("allowed edge refused: %v", err)
					}
					if sess.Status != to {
						t.Fatalf("status = %s", sess.Status)
					}
				} else if ErrorCode(err) != ECONFLICT {
					t.Fatalf("illegal edge: err = %v, want conflict", err)
				}
				if err := tx.Commit(ctx); err != nil && allowed {
					t.Fatal(err)
				}
				var status string
				var events int
				if err := pool.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM session_events WHERE session_id = $1)
					FROM payment_sessions WHERE id = $1`, id).Scan(&status, &events); err != nil {
					t.Fatal(err)
				}
				wantStatus, wantEvents := from, 0
				if allowed {
					wantStatus, wantEvents = to, 1
				}
				if Status(status) != wantStatus || events != wantEvents {
					t.Fatalf("after: status %s events %d, want %s %d", status, events, wantStatus, wantEvents)
				}
				if allowed {
					var evFrom, evTo string
					if err := pool.QueryRow(ctx, `SELECT from_status, to_status FROM session_events WHERE session_id = $1`, id).Scan(&evFrom, &evTo); err != nil {
						t.Fatal(err)
					}
					if Status(evFrom) != from || Status(evTo) != to {
						t.Fatalf("timeline event %s -> %s, want %s -> %s", evFrom, evTo, from, to)
					}
				}
			})
		}
	}
}

// The table itself: terminal states lead nowhere, Failed is reachable from every non-terminal
// state, Canceled only through Canceling, Completed never leaves.
func TestTransitionTableShape(t *testing.T) {
	for _, s := range AllStatuses {
		for _, to := range AllStatuses {
			if s.Terminal() && CanTransition(s, to) {
				t.Errorf("terminal %s may go to %s", s, to)
			}
		}
		if !s.Terminal() && !CanTransition(s, StatusFailed) {
			t.Errorf("%s cannot fail", s)
		}
		if s != StatusCanceling && CanTransition(s, StatusCanceled) {
			t.Errorf("%s may skip Canceling", s)
		}
	}
}

// decide, the mapping from (our state, gateway state) to an outcome, for every pair.
func TestDecideEveryPair(t *testing.T) {
	gs := []GatewayStatus{GatewayPending, GatewayAuthorized, GatewaySucceeded, GatewayDeclined, GatewayExpired, GatewayReversed}
	for _, cur := range AllStatuses {
		for _, g := range gs {
			for _, asked := range []bool{false, true} {
				oc := decide(cur, g, asked)
				if oc.to != "" && !CanTransition(cur, oc.to) {
					t.Errorf("decide(%s, %s) = %s: not an edge of the table", cur, g, oc.to)
				}
				if cur.Terminal() && oc.to != "" {
					t.Errorf("decide(%s, %s) moves a terminal session to %s", cur, g, oc.to)
				}
				if (cur == StatusFailed || cur == StatusCanceled) && (g == GatewaySucceeded || g == GatewayAuthorized) && oc.caseKind != CaseLatePayment {
					t.Errorf("decide(%s, %s): late payment must open a case, got %+v", cur, g, oc)
				}
			}
		}
	}
	want := map[[2]string]Status{
		{"Registering", "pending"}: StatusRegistered, {"Unknown", "pending"}: StatusRegistered,
		{"Registered", "authorized"}: StatusAuthorized, {"Registered", "succeeded"}: StatusCompleted,
		{"Authorized", "succeeded"}: StatusCompleted, {"Registered", "declined"}: StatusFailed,
		{"Registered", "expired"}: StatusFailed, {"Canceling", "reversed"}: StatusCanceled,
		{"Canceling", "succeeded"}: StatusCompleted, {"Completed", "authorized"}: "",
		{"Authorized", "pending"}: "", {"Registered", "pending"}: "",
	}
	for k, w := range want {
		if got := decide(Status(k[0]), GatewayStatus(k[1]), false).to; got != w {
			t.Errorf("decide(%s, %s) = %q, want %q", k[0], k[1], got, w)
		}
	}
	if oc := decide(StatusRegistered, GatewayReversed, false); oc.caseKind != CaseUnexpectedReversal {
		t.Errorf("unrequested reversal: %+v", oc)
	}
}
