package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The sweeper drain (issue 10): N due sessions that the gateway reports succeeded — the morning
// after an outage, thousands of approved payments waiting for the patrol to settle them — drained
// by 1 and 2 replicas' patrols (SWEEP_CONCURRENCY each) against a gateway that answers after 0,
// 50 or 200 ms. Each drive is the real one: claim (SKIP LOCKED + lease), ask the gateway, apply
// Completed with its ledger entry under the order → session locks, release.
//
// Anchors: the ideal replicas × concurrency / latency (nothing can drain faster with that many
// calls in flight), and River (github.com/riverqueue/river) working the same number of jobs with
// the same workers per client and clients per replica on the same PostgreSQL, each job sleeping
// the same latency and writing one row. River's fetch cooldown is set to its minimum (1 ms, poll
// 50 ms): its default 100 ms cooldown would hold it back at low latency, and the anchor should be
// River at its best, not at its most conservative.
const (
	drainWidth = 16
	// poolConns is every replica's (and every River client's) connection pool.
	poolConns = drainWidth + 4
)

var drainLatencies = []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond}

func sweeperDrain(ctx context.Context, env *Env) ([]Figure, error) {
	n := env.Size(200, 10000)
	latencies := drainLatencies
	if v := env.Getenv("BENCH_LATENCIES"); v != "" { // e.g. "0" or "0,200": only these (profiling)
		latencies = nil
		for _, f := range strings.Split(v, ",") {
			ms, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || ms < 0 {
				return nil, fmt.Errorf("BENCH_LATENCIES: %q is not a list of milliseconds", v)
			}
			latencies = append(latencies, time.Duration(ms)*time.Millisecond)
		}
	}
	var out []Figure
	for _, lat := range latencies {
		for _, replicas := range []int{1, 2} {
			name := fmt.Sprintf("sweeper drain %s x%d", latencyName(lat), replicas)
			// At 0 ms a drain takes seconds and one pair moved by ±0.1 between runs on this
			// machine (0.95 and 1.18 of River minutes apart): three pairs alternate there, and
			// each side's rate is its sessions over its time. The slower drains take half a
			// minute and more each and vary less: one pair.
			pairs := 1
			if lat == 0 {
				pairs = env.Size(1, 3)
			}
			var oursTime, theirsTime float64
			for range pairs {
				ours, err := drainPitlane(ctx, env, n, lat, replicas)
				if err != nil {
					return nil, fmt.Errorf("%s: pitlane: %w", name, err)
				}
				theirs, err := drainRiver(ctx, env, n, lat, replicas)
				if err != nil {
					return nil, fmt.Errorf("%s: river: %w", name, err)
				}
				if pairs > 1 {
					env.Logf("  %s: pair: pitlane %.0f sessions/s, River %.0f jobs/s", name, ours, theirs)
				}
				oursTime += float64(n) / max(ours, 1e-9)
				theirsTime += float64(n) / max(theirs, 1e-9)
			}
			ours, theirs := float64(pairs*n)/oursTime, float64(pairs*n)/theirsTime
			env.Logf("  %s: pitlane %.0f sessions/s, River %.0f jobs/s", name, ours, theirs)
			if lat > 0 {
				f := Figure{Name: name + " vs ideal", Value: ours, Unit: "sessions/s",
					Anchor: "ideal: replicas x concurrency / latency", AnchorValue: float64(replicas*drainWidth) / lat.Seconds()}
				if lat == 200*time.Millisecond {
					f.MinRatio = 0.8
				}
				out = append(out, f)
			}
			out = append(out, Figure{Name: name + " vs River", Value: ours, Unit: "sessions/s",
				Anchor: fmt.Sprintf("River v0.51, %d workers x %d client(s)", drainWidth, replicas), AnchorValue: theirs, MinRatio: 1.0})
		}
	}
	return out, nil
}

func latencyName(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }

// drainPitlane seeds n due Registered sessions (their payments succeeded at the gateway) and
// returns how many sessions per second `replicas` patrols settle.
func drainPitlane(ctx context.Context, env *Env, n int, latency time.Duration, replicas int) (float64, error) {
	url, err := env.NewDatabase(ctx, true)
	if err != nil {
		return 0, err
	}
	gw := fakegw.New()
	if err := seedDue(ctx, url, gw, n); err != nil {
		return 0, fmt.Errorf("seed: %w", err)
	}
	gw.SetLatency(latency)
	svcs := make([]*payments.Service, replicas)
	for r := range replicas {
		pool, err := Pool(ctx, url, poolConns)
		if err != nil {
			return 0, err
		}
		defer pool.Close()
		svcs[r] = payments.NewService(pool, payments.Config{Gateway: gw, ReplicaID: fmt.Sprintf("bench-%d", r),
			SweepConcurrency: drainWidth, Logger: slog.New(slog.DiscardHandler)})
	}
	started := time.Now()
	driven := make([]int, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for r, svc := range svcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			driven[r], errs[r] = svc.SweepOnce(ctx)
		}()
	}
	wg.Wait()
	elapsed := time.Since(started)
	total := 0
	for r := range replicas {
		if errs[r] != nil {
			return 0, errs[r]
		}
		total += driven[r]
	}
	var completed int
	if err := svcs[0].DB().QueryRow(ctx, `SELECT count(*) FROM payment_sessions WHERE status = 'Completed'`).Scan(&completed); err != nil {
		return 0, err
	}
	if total != n || completed != n {
		return 0, fmt.Errorf("drove %d, settled %d of %d sessions", total, completed, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// seedDue writes n due Registered sessions with COPY, each with a payment at the fake gateway
// that has succeeded.
func seedDue(ctx context.Context, url string, gw *fakegw.Gateway, n int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	now := time.Now().UTC()
	due := now.Add(-time.Second)
	orders := make([][]any, n)
	sessions := make([][]any, n)
	for i := range n {
		id := uuid.New()
		order := fmt.Sprintf("bench-%d", i)
		gp, err := gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: id.String(), Reference: id.String(), Amount: 1000, Currency: "EUR"})
		if err != nil {
			return err
		}
		gw.SetStatus(gp.ID, payments.GatewaySucceeded)
		orders[i] = []any{order, id, now, now}
		sessions[i] = []any{id, order, int64(1000), "EUR", "Registered", gw.Name(), gp.ID, due, now, now}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"order_id", "active_session_id", "created_at", "updated_at"},
		pgx.CopyFromRows(orders)); err != nil {
		return err
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"payment_sessions"}, []string{"id", "order_id", "amount", "currency", "status",
		"gateway", "gateway_payment_id", "next_check_at", "created_at", "updated_at"}, pgx.CopyFromRows(sessions)); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `ANALYZE`)
	return err
}

// sleepArgs is the River anchor's job: sleep the gateway's latency, write one row.
type sleepArgs struct {
	Seq int `json:"seq"`
}

func (sleepArgs) Kind() string { return "bench_sleep" }

type sleepWorker struct {
	river.WorkerDefaults[sleepArgs]
	latency time.Duration
	pool    *pgxpool.Pool
}

func (w *sleepWorker) Work(ctx context.Context, job *river.Job[sleepArgs]) error {
	if w.latency > 0 {
		t := time.NewTimer(w.latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	_, err := w.pool.Exec(ctx, `INSERT INTO bench_done (job_id, seq) VALUES ($1, $2)`, job.ID, job.Args.Seq)
	return err
}

// drainRiver inserts n jobs, then starts `replicas` River clients (drainWidth workers each) and
// returns how many jobs per second they complete (counted from River's completion events, which
// come after the completion is written).
func drainRiver(ctx context.Context, env *Env, n int, latency time.Duration, replicas int) (float64, error) {
	url, err := env.NewDatabase(ctx, false)
	if err != nil {
		return 0, err
	}
	setup, err := Pool(ctx, url, poolConns)
	if err != nil {
		return 0, err
	}
	defer setup.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(setup), nil)
	if err != nil {
		return 0, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	if _, err := setup.Exec(ctx, `CREATE TABLE bench_done (id bigserial PRIMARY KEY, job_id bigint NOT NULL, seq integer NOT NULL,
		done_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, err
	}
	inserter, err := river.NewClient(riverpgxv5.New(setup), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, err
	}
	params := make([]river.InsertManyParams, 0, 1000)
	for i := range n {
		params = append(params, river.InsertManyParams{Args: sleepArgs{Seq: i}})
		if len(params) == cap(params) || i == n-1 {
			if _, err := inserter.InsertManyFast(ctx, params); err != nil {
				return 0, fmt.Errorf("insert jobs: %w", err)
			}
			params = params[:0]
		}
	}
	if _, err := setup.Exec(ctx, `ANALYZE`); err != nil {
		return 0, err
	}

	clients := make([]*river.Client[pgx.Tx], replicas)
	events := make(chan struct{}, n)
	var subs []func()
	for r := range replicas {
		pool, err := Pool(ctx, url, poolConns)
		if err != nil {
			return 0, err
		}
		defer pool.Close()
		workers := river.NewWorkers()
		river.AddWorker(workers, &sleepWorker{latency: latency, pool: pool})
		c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
			Logger:            slog.New(slog.DiscardHandler),
			Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: drainWidth}},
			Workers:           workers,
			FetchCooldown:     river.FetchCooldownMin,
			FetchPollInterval: 50 * time.Millisecond,
		})
		if err != nil {
			return 0, err
		}
		ch, cancel := c.SubscribeConfig(&river.SubscribeConfig{ChanSize: n, Kinds: []river.EventKind{river.EventKindJobCompleted}})
		subs = append(subs, cancel)
		go func() {
			for range ch {
				events <- struct{}{}
			}
		}()
		clients[r] = c
	}
	defer func() {
		for _, cancel := range subs {
			cancel()
		}
	}()
	started := time.Now()
	for _, c := range clients {
		if err := c.Start(ctx); err != nil {
			return 0, err
		}
	}
	deadline := time.NewTimer(time.Duration(n)*latency + 10*time.Minute)
	defer deadline.Stop()
	for done := 0; done < n; done++ {
		select {
		case <-events:
		case <-deadline.C:
			return 0, fmt.Errorf("river completed %d of %d jobs before the deadline", done, n)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	elapsed := time.Since(started)
	for _, c := range clients {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := c.Stop(sctx)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("stop: %w", err)
		}
	}
	var rows int
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM bench_done`).Scan(&rows); err != nil {
		return 0, err
	}
	if rows != n {
		return 0, fmt.Errorf("river wrote %d rows for %d jobs", rows, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}
