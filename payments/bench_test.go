package payments_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"pitlane/payments"
)

// Benchmarks print figures (`make bench`); nothing here asserts a time.

// Create for distinct orders from parallel goroutines: claim + register + apply per op.
func BenchmarkCreateDistinctOrders(b *testing.B) {
	bb := newBench(b)
	var n atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := bb.svc.Create(context.Background(), api, payments.CreateInput{OrderID: fmt.Sprintf("bench-%d", i), Amount: 100, Currency: "EUR"}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
}

// Repeated clicks on one order: every op serialises on the order's advisory lock and returns the
// existing session (the hot-order case of the first seed article).
func BenchmarkCreateSameOrder(b *testing.B) {
	bb := newBench(b)
	in := payments.CreateInput{OrderID: "hot-order", Amount: 100, Currency: "EUR"}
	if _, err := bb.svc.Create(context.Background(), api, in); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := bb.svc.Create(context.Background(), api, in); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "clicks/s")
}

// Check of a session whose answer is already applied: gateway call + locked re-read, no write.
func BenchmarkCheckApplied(b *testing.B) {
	bb := newBench(b)
	r, err := bb.svc.Create(context.Background(), api, payments.CreateInput{OrderID: "checked", Amount: 100, Currency: "EUR"})
	if err != nil {
		b.Fatal(err)
	}
	bb.gw.SetStatus(r.Session.GatewayPaymentID, payments.GatewaySucceeded)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := bb.svc.Check(context.Background(), api, r.Session.ID); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
}

// One sweeper round over 500 due sessions: claim (SKIP LOCKED) + drive + release per session.
func BenchmarkSweepRound(b *testing.B) {
	bb := newBench(b)
	const perRound = 500
	bb.seedRegistered(b, perRound)
	ctx := context.Background()
	var driven int
	var elapsed time.Duration
	for range b.N {
		if _, err := bb.pool.Exec(ctx, `UPDATE payment_sessions SET next_check_at = $1, check_attempts = 0`, bb.clock.Now()); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		n, err := bb.svc.SweepOnce(ctx)
		if err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		driven += n
	}
	b.ReportMetric(float64(driven)/elapsed.Seconds(), "sessions/s")
}
