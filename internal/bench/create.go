package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace/noop"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Create through the core against what PostgreSQL allows for Create's own statements (issue 12):
// C clients creating payments for distinct orders (the fake gateway answers at once) beside
// pgbench running the very statements one Create sent (pgbench.go), with the same C on the same
// cluster; and the hot order — C clients clicking Pay on one order whose session exists — beside
// pgbench running the statements of one such click.

// benchClients is the figures' C: a few clients per core of these small machines, as many as a
// replica's pool has connections here (pgxpool's default, at least 4). Both sides' rates depend
// on it, in opposite directions: the create-sweep figure runs C = 2, 4 and 8.
const benchClients = 4

var api = payments.Actor{Kind: payments.ActorAPI, ID: "bench"}

// coreService is a service over a fresh pool of conns connections on url, with a fake gateway,
// discarding its logs. tracer (optional) sees every statement.
func coreService(ctx context.Context, url string, conns int32, gw *fakegw.Gateway, tracer any) (*payments.Service, *pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = conns
	if r, ok := tracer.(*recorder); ok && r != nil {
		cfg.ConnConfig.Tracer = r
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	// Tracing off as `pitlane serve` has it without an OTLP endpoint (telemetry's no-op provider).
	svc := payments.NewService(pool, payments.Config{Gateway: gw, ReplicaID: "bench", Logger: slog.New(slog.DiscardHandler),
		TracerProvider: noop.NewTracerProvider()})
	return svc, pool, nil
}

// coreCreates is the create figure's load (benchClients clients creating payments for new
// orders through payments.Create, fake gateway at 0 ms) on a database of its own, warmed up.
type coreCreates struct {
	svc     *payments.Service
	pool    *pgxpool.Pool
	clients int
	rounds  int // numbers the orders of each round apart
}

func newCoreCreates(ctx context.Context, env *Env) (*coreCreates, error) {
	return newCoreCreatesC(ctx, env, benchClients)
}

// newCoreCreatesC is the load with another C (clients, and as many connections).
func newCoreCreatesC(ctx context.Context, env *Env, clients int) (*coreCreates, error) {
	url, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	svc, pool, err := coreService(ctx, url, int32(clients), fakegw.New(), nil)
	if err != nil {
		return nil, err
	}
	c := &coreCreates{svc: svc, pool: pool, clients: clients}
	if _, err := closedLoop(ctx, clients, 0, clients*4, c.create(0)); err != nil {
		pool.Close()
		return nil, fmt.Errorf("core warm-up: %w", err)
	}
	return c, nil
}

func (c *coreCreates) create(round int) func(ctx context.Context, worker, seq int) error {
	return func(ctx context.Context, worker, seq int) error {
		_, err := c.svc.Create(ctx, api, payments.CreateInput{OrderID: fmt.Sprintf("core-%d-%d-%d", round, worker, seq), Amount: 1000, Currency: "EUR"})
		return err
	}
}

// round runs the load for d, and says what CPU it cost (ms, this program and PostgreSQL).
func (c *coreCreates) round(ctx context.Context, d time.Duration) (loopResult, float64, error) {
	res, byKind, err := c.roundByKind(ctx, d)
	return res, byKind["bench"] + byKind["postgres"], err
}

// roundByKind is round with the CPU of this program ("bench") and of PostgreSQL apart.
func (c *coreCreates) roundByKind(ctx context.Context, d time.Duration) (loopResult, map[string]float64, error) {
	c.rounds++
	cpu0 := sampleCPU(0)
	res, err := closedLoop(ctx, c.clients, d, 0, c.create(c.rounds))
	if err != nil {
		return loopResult{}, nil, fmt.Errorf("core: %w", err)
	}
	byKind, _ := cpuPerOp(cpu0, sampleCPU(0), 1)
	return res, byKind, nil
}

func (c *coreCreates) close() { c.pool.Close() }

func createFigures(ctx context.Context, env *Env) ([]Figure, error) {
	// Rounds alternate the core and its anchor, so that the machine's drift (this VM's rate moves
	// by ±20% within minutes) hits both sides alike: six short rounds a side, not two long ones.
	d := time.Duration(env.Size(2, 5)) * time.Second
	rounds := env.Size(1, 6)
	core, err := newCoreCreates(ctx, env)
	if err != nil {
		return nil, err
	}
	defer core.close()
	benchURL, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}

	capt, err := captureCreate(ctx, benchURL)
	if err != nil {
		return nil, err
	}
	stmts, script, res := capt.stmts, capt.script, capt.res
	env.Logf("  create: %d statements per Create", len(stmts))

	// The third side, reported without a target: the same statements in the same pipelines
	// through pgx alone, on a database of its own, with fresh ids shaped like the core's load's.
	aloneURL, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	alonePool, err := Pool(ctx, aloneURL, benchClients)
	if err != nil {
		return nil, err
	}
	defer alonePool.Close()
	aloneRound := 0
	fresh := func(worker, seq int) map[string]string {
		return map[string]string{captureOrder: fmt.Sprintf("alone-%d-%d-%d", aloneRound, worker, seq), res.Session.ID: uuid.NewString(),
			res.Session.GatewayPaymentID: fmt.Sprintf("gp_alone_%d_%d_%d", aloneRound, worker, seq)}
	}
	var alone loopResult

	var ours loopResult
	var tps float64
	// The CPU of each side over its rounds (ms): the core's (this program and PostgreSQL) and
	// pgbench's (its process and PostgreSQL).
	var coreCPU, anchorCPU float64
	var anchorTxns int
	for round := range rounds {
		got, coreKinds, err := core.roundByKind(ctx, d)
		if err != nil {
			return nil, err
		}
		cpu := coreKinds["bench"] + coreKinds["postgres"]
		coreCPU += cpu
		ours.n += got.n
		ours.elapsed += got.elapsed
		aloneRound++
		cpuAlone := sampleCPU(0)
		var raw loopResult
		pprof.Do(ctx, pprof.Labels("figure", "create-pgx-alone"), func(ctx context.Context) {
			raw, err = pgxAlone(ctx, alonePool, stmts, d, fresh)
		})
		if err != nil {
			return nil, fmt.Errorf("pgx alone: %w", err)
		}
		aloneKinds, _ := cpuPerOp(cpuAlone, sampleCPU(0), max(raw.n, 1))
		alone.n += raw.n
		alone.elapsed += raw.elapsed
		cpu0 := sampleCPU(0)
		pg, err := runPgbench(ctx, env, benchURL, script.with("n=0", fmt.Sprintf("round=%d", round)), benchClients, d)
		if err != nil {
			return nil, err
		}
		byKind, _ := cpuPerOp(cpu0, sampleCPU(0), 1)
		anchorCPU += byKind["postgres"] + pg.cpu*1000
		anchorTxns += pg.txns
		tps += pg.tps / float64(rounds)
		n, m := float64(max(got.n, 1)), float64(max(pg.txns, 1))
		env.Logf("  create: round: core %.0f/s (%.2f ms CPU each: Go %.2f, PostgreSQL %.2f), pgx alone %.0f/s (Go %.2f, PostgreSQL %.2f), pgbench %.0f/s (%.2f ms: pgbench %.2f, PostgreSQL %.2f)",
			got.rate(), cpu/n, coreKinds["bench"]/n, coreKinds["postgres"]/n,
			raw.rate(), aloneKinds["bench"], aloneKinds["postgres"],
			pg.tps, (byKind["postgres"]+pg.cpu*1000)/m, pg.cpu*1000/m, byKind["postgres"]/m)
	}
	coreRate := ours.rate()
	coreCPU /= float64(max(ours.n, 1))
	anchorCPU /= float64(max(anchorTxns, 1))
	env.Logf("  create: core %.0f/s, pgx alone %.0f/s, pgbench %.0f/s", coreRate, alone.rate(), tps)
	env.Logf("  create: CPU per Create, the core (this program: the core and its load; PostgreSQL) %.2f ms, pgbench (its process; PostgreSQL) %.2f ms: where both keep the cores busy, the core reaches at most %.2f of pgbench",
		coreCPU, anchorCPU, anchorCPU/max(coreCPU, 1e-9))
	out := []Figure{{Name: fmt.Sprintf("create, distinct orders, gateway 0ms, C=%d", benchClients), Value: coreRate, Unit: "creates/s",
		Anchor: fmt.Sprintf("pgbench: Create's %d statements, C=%d", len(stmts), benchClients), AnchorValue: tps, MinRatio: 0.8},
		{Name: fmt.Sprintf("create through pgx alone (the same statements and pipelines on held connections, no core), C=%d", benchClients),
			Value: alone.rate(), Unit: "creates/s", Anchor: fmt.Sprintf("pgbench: Create's %d statements, C=%d", len(stmts), benchClients),
			AnchorValue: tps, ReportOnly: true},
		// What the two rates are made of: the machine's CPU per Create on each side.
		{Name: "create: CPU per Create through the core, all processes (this program: the core and its load; PostgreSQL)",
			Value: coreCPU, Unit: "ms", Anchor: "CPU per transaction of the pgbench anchor (pgbench; PostgreSQL)", AnchorValue: anchorCPU, ReportOnly: true}}

	return out, nil
}

// captureOrder is the order of the recorded Create.
const captureOrder = "bench-captured-order-0001"

// capturedCreate is one Create recorded on the anchor's database, and the pgbench script of its
// statements.
type capturedCreate struct {
	stmts  []statement
	script pgbenchScript
	res    payments.CreateResult
}

// captureCreate records one Create on the database at url (the anchor's: its row stays there)
// and builds the anchor's script from its statements.
func captureCreate(ctx context.Context, url string) (capturedCreate, error) {
	rec := &recorder{}
	capSvc, capPool, err := coreService(ctx, url, 1, fakegw.New(), rec)
	if err != nil {
		return capturedCreate{}, err
	}
	defer capPool.Close()
	rec.start()
	res, err := capSvc.Create(ctx, api, payments.CreateInput{OrderID: captureOrder, Amount: 1000, Currency: "EUR"})
	stmts := rec.stop()
	if err != nil {
		return capturedCreate{}, fmt.Errorf("capture: %w", err)
	}
	// The anchor's ids have the shapes of the core's load's: a random session id, and order and
	// gateway payment ids that grow by client (core-ROUND-WORKER-N, gp_fake_N). Random order ids
	// scattered the anchor's index inserts as its tables grew, and its rate fell round by round
	// while the core's held (the eighth session's log). pgbench keeps a client's variables from
	// one transaction to the next: n counts the client's transactions from -D n=0.
	script, err := buildScript(stmts, map[string]string{captureOrder: "oid", res.Session.ID: "sid", res.Session.GatewayPaymentID: "gpid"},
		`\set n :n + 1
SELECT gen_random_uuid()::text AS sid, 'pgbench-' || :round || '-' || :client_id || '-' || :n AS oid, 'gp_pgbench_' || :round || '_' || :client_id || '_' || :n AS gpid \gset`)
	if err != nil {
		return capturedCreate{}, fmt.Errorf("capture: %w", err)
	}
	return capturedCreate{stmts: stmts, script: script, res: res}, nil
}

// sweepClients are the C of the create-sweep figure.
var sweepClients = []int{2, 4, 8}

// createSweep runs the create figure's two sides at C = 2, 4 and 8, reported without a target:
// one rate per side and C, and each side at its best C against the other's. The create figure
// judges the two at one C; this shows how that judgement moves with C. Each C gets databases of
// its own; the sides alternate round by round as in the create figure.
func createSweep(ctx context.Context, env *Env) ([]Figure, error) {
	d := time.Duration(env.Size(1, 5)) * time.Second
	rounds := env.Size(1, 2)
	var out []Figure
	var bestCore, bestAnchor float64
	var bestCoreC, bestAnchorC int
	for _, clients := range sweepClients {
		core, err := newCoreCreatesC(ctx, env, clients)
		if err != nil {
			return nil, err
		}
		benchURL, err := env.NewDatabase(ctx, true)
		if err != nil {
			core.close()
			return nil, err
		}
		capt, err := captureCreate(ctx, benchURL)
		if err != nil {
			core.close()
			return nil, err
		}
		var ours loopResult
		var tps float64
		for round := range rounds {
			got, _, err := core.round(ctx, d)
			if err != nil {
				core.close()
				return nil, err
			}
			ours.n += got.n
			ours.elapsed += got.elapsed
			pg, err := runPgbench(ctx, env, benchURL, capt.script.with("n=0", fmt.Sprintf("round=%d", round)), clients, d)
			if err != nil {
				core.close()
				return nil, err
			}
			tps += pg.tps / float64(rounds)
		}
		core.close()
		rate := ours.rate()
		env.Logf("  create-sweep: C=%d: core %.0f/s, pgbench %.0f/s (%.2f)", clients, rate, tps, rate/max(tps, 1e-9))
		out = append(out, Figure{Name: fmt.Sprintf("create sweep, C=%d", clients), Value: rate, Unit: "creates/s",
			Anchor: fmt.Sprintf("pgbench: Create's statements, C=%d", clients), AnchorValue: tps, ReportOnly: true})
		if rate > bestCore {
			bestCore, bestCoreC = rate, clients
		}
		if tps > bestAnchor {
			bestAnchor, bestAnchorC = tps, clients
		}
	}
	out = append(out, Figure{Name: fmt.Sprintf("create sweep, each side at its best C (the core at C=%d)", bestCoreC), Value: bestCore,
		Unit: "creates/s", Anchor: fmt.Sprintf("pgbench at its best C (C=%d)", bestAnchorC), AnchorValue: bestAnchor, ReportOnly: true})
	return out, nil
}

// clickFigures: C clients clicking Pay on one order whose session exists (every click answers
// that session), beside pgbench running one click's statements on the same order. A third side,
// reported without a target, runs the same recorded statements through pgx alone (C goroutines,
// each on a connection it holds, no core): the floor this machine's Go client stack sets, so the
// gap to pgbench splits into what pgx costs and what the core adds to it.
func clickFigures(ctx context.Context, env *Env) ([]Figure, error) {
	d := time.Duration(env.Size(2, 5)) * time.Second
	rounds := env.Size(1, 6)
	url, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	gw := fakegw.New()
	svc, pool, err := coreService(ctx, url, benchClients, gw, nil)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	in := payments.CreateInput{OrderID: "hot-order", Amount: 1000, Currency: "EUR"}
	first, err := svc.Create(ctx, api, in)
	if err != nil {
		return nil, err
	}
	clickOn := func(svc *payments.Service) func(ctx context.Context, _, _ int) error {
		return func(ctx context.Context, _, _ int) error {
			res, err := svc.Create(ctx, api, in)
			if err == nil && (res.Created || res.Session.ID != first.Session.ID) {
				err = fmt.Errorf("a click created session %s", res.Session.ID)
			}
			return err
		}
	}
	click := clickOn(svc)
	rec := &recorder{}
	capSvc, capPool, err := coreService(ctx, url, 1, gw, rec)
	if err != nil {
		return nil, err
	}
	defer capPool.Close()
	rec.start()
	err = clickOn(capSvc)(ctx, 0, 0)
	stmts := rec.stop()
	if err != nil {
		return nil, err
	}
	script, err := buildScript(stmts, nil, "")
	if err != nil {
		return nil, err
	}
	if _, err := closedLoop(ctx, benchClients, 0, benchClients*4, click); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	rawPool, err := Pool(ctx, url, benchClients)
	if err != nil {
		return nil, err
	}
	defer rawPool.Close()
	var ours, raw loopResult
	var tps float64
	for range rounds {
		var got loopResult
		pprof.Do(ctx, pprof.Labels("figure", "clicks"), func(ctx context.Context) {
			got, err = closedLoop(ctx, benchClients, d, 0, click)
		})
		if err != nil {
			return nil, err
		}
		ours.n += got.n
		ours.elapsed += got.elapsed
		pprof.Do(ctx, pprof.Labels("figure", "clicks-pgx-alone"), func(ctx context.Context) {
			got, err = pgxAlone(ctx, rawPool, stmts, d, nil)
		})
		if err != nil {
			return nil, fmt.Errorf("pgx alone: %w", err)
		}
		raw.n += got.n
		raw.elapsed += got.elapsed
		pg, err := runPgbench(ctx, env, url, script, benchClients, d)
		if err != nil {
			return nil, err
		}
		tps += pg.tps / float64(rounds)
	}
	env.Logf("  clicks: core %.0f/s, pgx alone %.0f/s, pgbench %.0f/s (%d statements per click)", ours.rate(), raw.rate(), tps, len(stmts))
	anchor := fmt.Sprintf("pgbench: a click's %d statements, C=%d", len(stmts), benchClients)
	return []Figure{
		{Name: fmt.Sprintf("clicks on one hot order, C=%d", benchClients), Value: ours.rate(), Unit: "clicks/s",
			Anchor: anchor, AnchorValue: tps, MinRatio: 0.8},
		{Name: fmt.Sprintf("clicks through pgx alone (the same statements on held connections, no core), C=%d", benchClients),
			Value: raw.rate(), Unit: "clicks/s", Anchor: anchor, AnchorValue: tps, ReportOnly: true},
	}, nil
}

// pgxAlone runs recorded statements, one after another, in a closed loop of benchClients
// goroutines for d, each on a pool connection it holds for the whole loop, reading every row
// without decoding it: the least a Go client on pgx can do for them. A recorded batch is sent
// as one batch (the core's pipelines). fresh, when not nil, gives every run new values for the
// recorded arguments it names by their text (a new order's ids); the rest are sent as recorded.
func pgxAlone(ctx context.Context, pool *pgxpool.Pool, stmts []statement, d time.Duration, fresh func(worker, seq int) map[string]string) (loopResult, error) {
	conns := make([]*pgxpool.Conn, benchClients)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return loopResult{}, err
		}
		defer c.Release()
		conns[i] = c
	}
	// Which arguments vary, found once: the loop only swaps them.
	type slot struct {
		arg  int
		text string
	}
	varying := make([][]slot, len(stmts))
	if fresh != nil {
		names := fresh(0, 0)
		for i, st := range stmts {
			for j, a := range st.args {
				if text, _, err := argText(a); err == nil {
					if _, ok := names[text]; ok {
						varying[i] = append(varying[i], slot{j, text})
					}
				}
			}
		}
	}
	readAll := func(rows pgx.Rows) error {
		for rows.Next() {
			_ = rows.RawValues()
		}
		rows.Close()
		return rows.Err()
	}
	return closedLoop(ctx, benchClients, d, 0, func(ctx context.Context, worker, seq int) error {
		conn := conns[worker]
		var values map[string]string
		if fresh != nil {
			values = fresh(worker, seq)
		}
		argsOf := func(i int) []any {
			if len(varying[i]) == 0 {
				return stmts[i].args
			}
			args := slices.Clone(stmts[i].args)
			for _, v := range varying[i] {
				args[v.arg] = values[v.text]
			}
			return args
		}
		for i := 0; i < len(stmts); {
			if stmts[i].batch == 0 {
				rows, err := conn.Query(ctx, stmts[i].sql, argsOf(i)...)
				if err != nil {
					return err
				}
				if err := readAll(rows); err != nil {
					return err
				}
				i++
				continue
			}
			b := &pgx.Batch{}
			j := i
			for ; j < len(stmts) && stmts[j].batch == stmts[i].batch; j++ {
				b.Queue(stmts[j].sql, argsOf(j)...)
			}
			br := conn.SendBatch(ctx, b)
			for range j - i {
				rows, err := br.Query()
				if err == nil {
					err = readAll(rows)
				}
				if err != nil {
					br.Close()
					return err
				}
			}
			if err := br.Close(); err != nil {
				return err
			}
			i = j
		}
		return nil
	})
}
