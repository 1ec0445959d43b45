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
// ≥ 0.9 of the rate with nothing held, measured before and after on the same service.
func lockIndependence(ctx context.Context, env *Env) ([]Figure, error) {
	n := env.Size(200, 1000)
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
	const held = "held-order"
	parked, release := make(chan struct{}), make(chan struct{})
	svc := payments.NewService(pool, payments.Config{Gateway: fakegw.New(), ReplicaID: "bench", Logger: slog.New(slog.DiscardHandler),
		Hooks: payments.Hooks{AfterClaimRead: func(_ context.Context, order string) {
			if order == held {
				close(parked)
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
	if _, err := run(); err != nil { // warm-up
		return nil, err
	}
	before, err := run()
	if err != nil {
		return nil, err
	}
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
	var locks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&locks); err != nil || locks == 0 {
		close(release)
		return nil, fmt.Errorf("no advisory lock held by the parked claim (%d, %v)", locks, err)
	}
	during, err := run()
	close(release)
	if herr := <-heldDone; err == nil && herr != nil {
		err = fmt.Errorf("the held Create: %w", herr)
	}
	if err != nil {
		return nil, err
	}
	after, err := run()
	if err != nil {
		return nil, err
	}
	anchor := (before + after) / 2
	env.Logf("  lock independence: %.0f creates/s with a claim held, %.0f/%.0f without", during, before, after)
	return []Figure{{Name: fmt.Sprintf("lock independence: %d Creates of other orders while one claim is held, C=%d", n, benchClients),
		Value: during, Unit: "creates/s", Anchor: "the same with nothing held (mean of before and after)", AnchorValue: anchor, MinRatio: 0.9}}, nil
}
