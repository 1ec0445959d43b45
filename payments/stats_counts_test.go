package payments_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"pitlane/payments"
)

// StatusCounts must equal counting the table, exactly, whatever happened: Creates, transitions
// (Check applying success), rows written behind the core's back, and folds of the deltas — also
// two folds and writers at the same time. Fails without migration 00021's trigger (no deltas)
// and with a fold that deletes rows it did not sum (counts drift).
func TestStatusCountsExactAcrossFolds(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	want := func() map[payments.Status]int {
		t.Helper()
		rows, err := b.pool.Query(ctx, `SELECT status, count(*) FROM payment_sessions GROUP BY status`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[payments.Status]int{}
		for rows.Next() {
			var st string
			var n int
			if err := rows.Scan(&st, &n); err != nil {
				t.Fatal(err)
			}
			out[payments.Status(st)] = n
		}
		return out
	}
	check := func(when string) {
		t.Helper()
		got, err := b.svc.StatusCounts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if w := want(); fmt.Sprint(got) != fmt.Sprint(w) {
			t.Fatalf("%s: StatusCounts = %v, counting the table says %v", when, got, w)
		}
	}
	check("empty")
	var ids []string
	for i := range 30 {
		res, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: fmt.Sprintf("o-%d", i), Amount: 100, Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Session.ID)
	}
	check("after creates")
	for _, id := range ids[:10] {
		s, _ := b.svc.Get(ctx, id)
		b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
		if _, err := b.svc.Check(ctx, api, id); err != nil {
			t.Fatal(err)
		}
	}
	check("after transitions")
	// Past the fold threshold: 2,000 status flips written directly, then readers fold while
	// writers keep flipping.
	for range 60 { // 60 × 20 sessions × 2 deltas
		if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET status = CASE status WHEN 'Registered' THEN 'Unknown' ELSE 'Registered' END
			WHERE status IN ('Registered', 'Unknown')`); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM session_status_deltas`); n < 2000 {
		t.Fatalf("only %d deltas: the test does not reach the fold", n)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				if w%2 == 0 {
					_, err := b.svc.StatusCounts(ctx)
					errs <- err
				} else if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET status = CASE status WHEN 'Registered' THEN 'Unknown' ELSE 'Registered' END
					WHERE id = $1`, ids[20+w]); err != nil {
					errs <- err
				}
			}
		}()
	}
	go func() { wg.Wait(); close(errs) }()
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	check("after concurrent folds")
	if n := b.count(t, `SELECT count(*) FROM session_status_deltas`); n > 1000 {
		t.Fatalf("%d delta rows left: the deltas were never folded", n)
	}
}
