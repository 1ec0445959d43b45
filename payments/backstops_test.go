package payments_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"pitlane/payments"
)

// The schema holds three money rules by itself (migration 00565), for a writer that skips the
// core's locks and checks: written here with raw SQL, as such a writer would, each is refused.
// Two concurrent refunds of 60 of a 100 payment, each reading "nothing refunded yet" without
// the session lock, would both pass a check made in Go; the trigger locks the session and sums
// again, so the second is refused even then.
func TestSchemaBackstopsRefuseWhatTheCoreNeverWrites(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	paid := b.completed(t, "o-backstop", 100)
	open := b.registered(t, "o-backstop-open", 100)
	refund := func(s payments.Session, amount int64, key string) error {
		_, err := b.pool.Exec(ctx, `INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key, created_at, updated_at)
			VALUES (gen_random_uuid(), $1, $2, $3, 'EUR', 'Pending', $4, now(), now())`, s.ID, s.OrderID, amount, key)
		return err
	}
	code := func(err error) string {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return pe.Code
		}
		return ""
	}
	if err := refund(paid, 60, "a"); err != nil {
		t.Fatalf("a refund within the amount: %v", err)
	}
	if err := refund(paid, 60, "b"); code(err) != "PT500" {
		t.Errorf("refunds past the amount received: %v, want PT500", err)
	}
	if err := refund(paid, 40, "c"); err != nil {
		t.Errorf("the rest of the amount: %v", err)
	}
	if err := refund(open, 110, "d"); code(err) != "PT500" {
		t.Errorf("a refund past the amount of a payment of another state: %v, want PT500", err)
	}
	// A refund that failed frees its amount; one that failed is never re-checked.
	if _, err := b.pool.Exec(ctx, `UPDATE refunds SET status = 'Failed' WHERE session_id = $1 AND request_key = 'c'`, paid.ID); err != nil {
		t.Fatal(err)
	}
	if err := refund(paid, 40, "e"); err != nil {
		t.Errorf("the amount of a failed refund again: %v", err)
	}

	if _, err := b.pool.Exec(ctx, `INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, created_at)
		VALUES ($1, $2, 'RefundIssued', -10, 'EUR', now())`, paid.OrderID, paid.ID); code(err) != "23514" {
		t.Errorf("a RefundIssued entry naming no refund: %v, want a check violation", err)
	}

	for _, to := range []string{"Registered", "Failed", "Canceling"} {
		if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET status = $2 WHERE id = $1`, paid.ID, to); code(err) != "PT500" {
			t.Errorf("a Completed payment set to %s: %v, want PT500", to, err)
		}
	}
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET status = 'Completed', updated_at = now() WHERE id = $1`, paid.ID); err != nil {
		t.Errorf("an update of a final payment that keeps its status: %v", err)
	}
}
