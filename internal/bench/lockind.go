package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Lock independence (issue 12): one order's claim is held open — its Create parked inside the
// claim transaction (Hooks.AfterClaimRead), its advisory lock and its order row locked — while C
// clients create payments for other orders. Nothing of theirs may wait for it: their rate must stay
// ≥ 0.9 of the rate with nothing held, measured in runs that alternate with the held ones on the
// same service.
func lockIndependence(ctx context.Context, env *Env) ([]Figure, error) {
	n := env.Size(200, 2000)
	url, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = benchClients + 1 // the held claim has a connection of its own in both runs
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	parked, release := make(chan struct{}), make(chan struct{})
	held := ""
	svc := payments.NewService(pool, payments.Config{Gateway: fakegw.New(), ReplicaID: "bench", Logger: slog.New(slog.DiscardHandler),
		Hooks: payments.Hooks{AfterClaimRead: func(_ context.Context, order string) {
			if order == held {
				parked <- struct{}{}
				<-release
			}
		}}})
	round := 0
	run := func() (float64, error) {
		round++
		r := round
		res, err := closedLoop(ctx, benchClients, 0, n, func(ctx context.Context, _, seq int) error {
			_, err := svc.Create(ctx, api, payments.CreateInput{OrderID: fmt.Sprintf("free-%d-%d", r, seq), Amount: 1000, Currency: "EUR"})
			return err
		})
		return res.rate(), err
	}
	// hold parks a Create of a new order inside its claim transaction; the returned func lets
	// it go and waits for it.
	hold := func(k int) (func() error, error) {
		held = fmt.Sprintf("held-order-%d", k)
		heldDone := make(chan error, 1)
		go func() {
			_, err := svc.Create(ctx, api, payments.CreateInput{OrderID: held, Amount: 1000, Currency: "EUR"})
			heldDone <- err
		}()
		select {
		case <-parked:
		case err := <-heldDone:
			return nil, fmt.Errorf("the held Create ended before parking: %v", err)
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("the held Create did not reach its claim")
		}
		let := func() error {
			release <- struct{}{}
			if err := <-heldDone; err != nil {
				return fmt.Errorf("the held Create: %w", err)
			}
			return nil
		}
		var locks int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&locks); err != nil || locks == 0 {
			let() //nolint:errcheck // the figure fails on the missing lock
			return nil, fmt.Errorf("no advisory lock held by the parked claim (%d, %v)", locks, err)
		}
		return let, nil
	}
	if _, err := run(); err != nil { // warm-up
		return nil, err
	}
	// Runs of a second or two are at the mercy of this machine's noise: free and held runs
	// alternate, three of each and a free one last, and the figure compares their means.
	var free, during []float64
	for k := range lockIndPairs {
		rate, err := run()
		if err != nil {
			return nil, err
		}
		free = append(free, rate)
		let, err := hold(k)
		if err != nil {
			return nil, err
		}
		rate, err = run()
		if lerr := let(); err == nil {
			err = lerr
		}
		if err != nil {
			return nil, err
		}
		during = append(during, rate)
	}
	rate, err := run()
	if err != nil {
		return nil, err
	}
	free = append(free, rate)
	env.Logf("  lock independence: %.0f creates/s with a claim held (%v), %.0f without (%v)", mean(during), during, mean(free), free)
	return []Figure{{Name: fmt.Sprintf("lock independence: %d Creates of other orders while one claim is held, C=%d", n, benchClients),
		Value: mean(during), Unit: "creates/s", Anchor: fmt.Sprintf("the same with nothing held (mean of %d runs alternating with the held ones)", len(free)),
		AnchorValue: mean(free), MinRatio: 0.9}}, nil
}

// lockIndPairs is how many (free, held) run pairs the lock independence figure alternates.
const lockIndPairs = 3

func mean(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
