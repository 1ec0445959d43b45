package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// Upgrade across 00740 (rolling-upgrade review, session 32; fixed by migration 00750, whose
// trigger and backfill give such cases their fact; negative control: without 00750's trigger,
// 2 cases): a late_payment case opened by a replica of the previous
// release (9f8d11d: its noteCase INSERT names no facts column, so the row gets 00740's default
// '{}'), or opened before the migration and still open at the deploy, is resolved by finance
// (refunded by hand) and then reconciliation on the new release opens it again: facts '{}' never
// match, and reconciliation's wording differs from Check's. 00740 has no backfill, and neither
// operations.md nor console.md says the promise ("a late payment first reported by its webhook or
// a Check and resolved is not reopened by reconciliation's other wording") skips such cases.
func TestALatePaymentCaseOfThePreviousReleaseIsNotReopened(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	dead := b.failed(t, "o-late-old", 100)
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded) // the late money
	if _, err := b.plain.Check(ctx, api, dead.ID); err != nil {      // only to get Check's wording
		t.Fatal(err)
	}
	var detail string
	var at time.Time
	if err := b.pool.QueryRow(ctx, `DELETE FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment' RETURNING detail, created_at`,
		dead.ID).Scan(&detail, &at); err != nil {
		t.Fatal(err)
	}
	// The same case as the previous release's Check writes it (9f8d11d payments/check.go noteCase, verbatim).
	if _, err := b.pool.Exec(ctx, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (session_id, kind) WHERE resolved_at IS NULL DO UPDATE
			SET detail = left(finance_cases.detail || E'\n' || 'Also (' || to_char($5::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') || ' UTC): ' || EXCLUDED.detail, 8000)
			WHERE strpos(finance_cases.detail, EXCLUDED.detail) = 0`, dead.ID, dead.OrderID, "late_payment", detail, at); err != nil {
		t.Fatal(err)
	}
	var caseID int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID).Scan(&caseID); err != nil {
		t.Fatal(err)
	}
	// After the deploy: finance refunds it by hand and resolves it on a new replica.
	if _, err := b.svc.ResolveCase(ctx, fin1, caseID, "refunded the late payment by hand at the gateway, ticket FIN-9", ""); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID); n != 1 {
		var d string
		_ = b.pool.QueryRow(ctx, `SELECT detail FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, dead.ID).Scan(&d)
		t.Errorf("late_payment cases for the one late payment finance resolved = %d, want 1; reopened as %q", n, d)
	}
}
