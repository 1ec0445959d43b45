package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The duplicate storm (issue 12): 200 Creates of one order arrive together while the gateway takes
// 2 s to register. pitlane must register once, and the 199 duplicates must not wait for the
// gateway: the claim is a short transaction and the gateway call happens after it committed.
//
// The anchor is the seed's own failure, implemented faithfully (seedSemaphore): the first seed
// article's stage 2, "a traffic light for the whole race" — a per-order SemaphoreSlim from a
// static ConcurrentDictionary, held across find-active, insert, the gateway's Register and the
// update. It registers once too (in one process), but every duplicate waits out the gateway.

const (
	stormSize    = 200
	stormLatency = 2 * time.Second
	stormConns   = 20
)

func duplicateStorm(ctx context.Context, env *Env) ([]Figure, error) {
	in := payments.CreateInput{OrderID: "storm-order", Amount: 1000, Currency: "EUR"}

	url, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	gw := fakegw.New()
	svc, pool, err := coreService(ctx, url, stormConns, gw, nil)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := warmUp(ctx, func(ctx context.Context, order string) error {
		_, err := svc.Create(ctx, api, payments.CreateInput{OrderID: order, Amount: 1000, Currency: "EUR"})
		return err
	}); err != nil {
		return nil, err
	}
	gw.SetLatency(stormLatency)
	registered := gw.Calls(fakegw.OpRegister)
	ours, err := storm(ctx, func(ctx context.Context) (bool, error) {
		res, err := svc.Create(ctx, api, in)
		return res.Created, err
	})
	if err != nil {
		return nil, fmt.Errorf("pitlane: %w", err)
	}
	if n := count(ctx, pool, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, in.OrderID); n != 1 {
		return nil, fmt.Errorf("pitlane: %d sessions for one order", n)
	}

	url, err = env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	seedGW := fakegw.New()
	seedPool, err := Pool(ctx, url, stormConns)
	if err != nil {
		return nil, err
	}
	defer seedPool.Close()
	seed := &seedSemaphore{locks: map[string]chan struct{}{}, pool: seedPool, gw: seedGW}
	if err := warmUp(ctx, func(ctx context.Context, order string) error {
		_, err := seed.Create(ctx, payments.CreateInput{OrderID: order, Amount: 1000, Currency: "EUR"})
		return err
	}); err != nil {
		return nil, err
	}
	seedGW.SetLatency(stormLatency)
	seedRegistered := seedGW.Calls(fakegw.OpRegister)
	theirs, err := storm(ctx, func(ctx context.Context) (bool, error) { return seed.Create(ctx, in) })
	if err != nil {
		return nil, fmt.Errorf("seed semaphore: %w", err)
	}

	regs, seedRegs := float64(gw.Calls(fakegw.OpRegister)-registered), float64(seedGW.Calls(fakegw.OpRegister)-seedRegistered)
	p99, seedP99 := ms(percentile(ours.duplicates, 99)), ms(percentile(theirs.duplicates, 99))
	env.Logf("  storm: pitlane %v registration(s), duplicates p50 %.1f ms p99 %.1f ms; seed semaphore %v, p99 %.0f ms",
		regs, ms(percentile(ours.duplicates, 50)), p99, seedRegs, seedP99)
	anchor := "the seed's per-order semaphore held across the gateway call"
	return []Figure{
		{Name: fmt.Sprintf("duplicate storm: %d Creates of one order, gateway 2s: registrations", stormSize), Value: regs, Unit: "registrations",
			Anchor: anchor, AnchorValue: seedRegs, MinValue: bound(1), MaxValue: bound(1)},
		{Name: "duplicate storm: duplicates' p99", Value: p99, Unit: "ms", Anchor: anchor, AnchorValue: seedP99, MaxValue: bound(100)},
	}, nil
}

// warmUp opens every connection of the pool and prepares the statements of both a new and a
// repeated Create on each (the gateway still answers at once): the storm measures the
// protocol, not a cold pool's connection set-up.
func warmUp(ctx context.Context, create func(ctx context.Context, order string) error) error {
	_, err := closedLoop(ctx, stormConns, 0, stormConns*6, func(ctx context.Context, _, seq int) error {
		return create(ctx, fmt.Sprintf("warm-%d", seq%(stormConns*2)))
	})
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	return nil
}

// stormResult is the latencies of the Creates that found the session another one made.
type stormResult struct {
	duplicates []time.Duration
}

// storm starts stormSize goroutines, releases them together and returns the duplicates'
// latencies; exactly one call must have created the session.
func storm(ctx context.Context, create func(ctx context.Context) (created bool, err error)) (stormResult, error) {
	var (
		mu      sync.Mutex
		res     stormResult
		created int
		errs    []error
		ready   sync.WaitGroup
		done    sync.WaitGroup
	)
	gate := make(chan struct{})
	for range stormSize {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			t := time.Now()
			c, err := create(ctx)
			d := time.Since(t)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case c:
				created++
			default:
				res.duplicates = append(res.duplicates, d)
			}
		}()
	}
	ready.Wait()
	close(gate)
	done.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if created != 1 {
		return res, fmt.Errorf("%d Creates made a session, want 1", created)
	}
	return res, nil
}

// seedSemaphore is the seed's CreateAsync (first article, stage 2), line by line:
//
//	var sem = locks.GetOrAdd(orderId, _ => new SemaphoreSlim(1, 1));
//	await sem.WaitAsync(ctx);
//	try {
//	    var active = await repository.FindActiveByOrderIdAsync(orderId, ctx);
//	    if (active is not null) return active;
//	    var payment = new PaymentSession(orderId, amount);
//	    await repository.AddAsync(payment, ctx); await uow.SaveChangesAsync(ctx);
//	    var result = await gateway.RegisterAsync(payment, ctx);
//	    payment.SetExternalId(result.PaymentId);
//	    await repository.UpdateAsync(payment, ctx); await uow.SaveChangesAsync(ctx);
//	    return payment;
//	} finally { sem.Release(); }
//
// on pitlane's tables, with the same gateway. The dictionary grows with every order and never
// shrinks — the seed's leak, kept because it is the anchor, not a pattern (pitlane has no such
// map).
type seedSemaphore struct {
	mu    sync.Mutex
	locks map[string]chan struct{}
	pool  *pgxpool.Pool
	gw    payments.Gateway
}

func (s *seedSemaphore) Create(ctx context.Context, in payments.CreateInput) (created bool, err error) {
	s.mu.Lock()
	sem, ok := s.locks[in.OrderID]
	if !ok {
		sem = make(chan struct{}, 1)
		s.locks[in.OrderID] = sem
	}
	s.mu.Unlock()
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-sem }()

	var id string
	err = s.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE order_id = $1 AND status = ANY($2)`,
		in.OrderID, []string{"Registering", "Registered", "Unknown", "Authorized", "Canceling"}).Scan(&id)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, err
	}
	id = uuid.NewString()
	now := time.Now()
	if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, $2, $2)
			ON CONFLICT (order_id) DO NOTHING`, in.OrderID, now); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, created_at, updated_at)
			VALUES ($1, $2, $3, $4, 'Registering', $5, $6, $6)`, id, in.OrderID, in.Amount, in.Currency, s.gw.Name(), now)
		return err
	}); err != nil {
		return false, err
	}
	gp, err := s.gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: id, Reference: id, Amount: in.Amount, Currency: in.Currency})
	if err != nil {
		return false, err
	}
	_, err = s.pool.Exec(ctx, `UPDATE payment_sessions SET status = 'Registered', gateway_payment_id = $2, updated_at = $3 WHERE id = $1`,
		id, gp.ID, time.Now())
	return err == nil, err
}

func count(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) int {
	var n int
	if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return -1
	}
	return n
}
