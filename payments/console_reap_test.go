package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/payments"
)

func TestReapConsole(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	now := b.clock.Now()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO sessions (token, data, expiry) VALUES ('old', '', now() - interval '1 minute'), ('live', '', now() + interval '1 hour')`, nil},
		{`INSERT INTO staff_login_throttle (email, failures, last_failure_at, locked_until) VALUES
			('stale@x', 2, $1, NULL), ('locked@x', 5, $1, $2), ('recent@x', 1, $2, NULL)`,
			[]any{now.Add(-payments.LoginThrottleRetention - time.Minute), now.Add(time.Minute)}},
		{`INSERT INTO checkout_intents (key, order_id, amount, currency, created_at) VALUES ($1, 'o', 1, 'EUR', $3), ($2, 'o', 1, 'EUR', $4)`,
			[]any{uuid.NewString(), uuid.NewString(), now.Add(-payments.CheckoutIntentRetention - time.Minute), now}},
	} {
		if _, err := b.pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	n, err := b.svc.ReapConsole(ctx)
	if err != nil || n != 3 {
		t.Fatalf("reaped %d, %v; want 3", n, err)
	}
	for table, want := range map[string]int{"sessions": 1, "staff_login_throttle": 2, "checkout_intents": 1} {
		if got := b.count(t, `SELECT count(*) FROM `+table); got != want {
			t.Errorf("%s: %d rows left, want %d", table, got, want)
		}
	}
}
