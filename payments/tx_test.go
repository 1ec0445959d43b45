package payments

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
)

// wireLog is a pgx tracer that writes down what reaches the wire: statements sent alone and
// pipelines (batches) with their statements.
type wireLog struct {
	mu      sync.Mutex
	alone   []string
	batches [][]string
}

func (w *wireLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	w.mu.Lock()
	w.alone = append(w.alone, d.SQL)
	w.mu.Unlock()
	return ctx
}
func (w *wireLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (w *wireLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	w.mu.Lock()
	w.batches = append(w.batches, nil)
	w.mu.Unlock()
	return ctx
}
func (w *wireLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	w.mu.Lock()
	w.batches[len(w.batches)-1] = append(w.batches[len(w.batches)-1], d.SQL)
	w.mu.Unlock()
}
func (w *wireLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (w *wireLog) reset() {
	w.mu.Lock()
	w.alone, w.batches = nil, nil
	w.mu.Unlock()
}

// roundTrips is how many exchanges the log shows: one per statement sent alone, one per pipeline.
func (w *wireLog) roundTrips() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.alone) + len(w.batches)
}

func tracedService(t *testing.T, lockTimeout time.Duration, mode ...pgx.QueryExecMode) (*Service, *pgxpool.Pool, *wireLog) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mode {
		cfg.ConnConfig.DefaultQueryExecMode = m
	}
	log := &wireLog{}
	cfg.ConnConfig.Tracer = log
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return NewService(pool, Config{LockTimeout: lockTimeout}), pool, log
}

// A core transaction's BEGIN and SET LOCAL lock_timeout reach the server in the pipeline of its
// first statement: a transaction of one statement is two round trips (the pipeline, COMMIT), not
// three. The statements still share one transaction, under the configured lock wait.
func TestTransactionBeginsWithItsFirstStatement(t *testing.T) {
	ctx := context.Background()
	svc, pool, log := tracedService(t, 1234*time.Millisecond)
	var timeout string
	var xid1, xid2 int64
	log.reset()
	err := svc.inTx(ctx, "test", func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout'), txid_current()`).Scan(&timeout, &xid1); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid2)
	})
	if err != nil {
		t.Fatal(err)
	}
	if timeout != "1234ms" {
		t.Errorf("lock_timeout in the transaction = %q, want 1234ms", timeout)
	}
	if xid1 != xid2 {
		t.Errorf("the two statements ran in transactions %d and %d, want one", xid1, xid2)
	}
	if len(log.batches) == 0 || len(log.batches[0]) != 4 || !strings.HasPrefix(strings.ToLower(log.batches[0][0]), "begin") ||
		!strings.HasPrefix(log.batches[0][1], "SET LOCAL lock_timeout") || !strings.HasPrefix(log.batches[0][2], "SET LOCAL idle_in_transaction_session_timeout") {
		t.Fatalf("first pipeline = %q, want BEGIN, the SET LOCALs and the first statement", log.batches)
	}
	for _, q := range log.alone {
		if strings.HasPrefix(strings.ToLower(q), "begin") {
			t.Errorf("BEGIN went alone: %q", q)
		}
	}
	// The pipeline, the second statement, COMMIT.
	if got := log.roundTrips(); got != 3 {
		t.Errorf("round trips = %d (alone %q, pipelines %q), want 3", got, log.alone, log.batches)
	}

	// Negative control: the same transaction begun the way pgx begins one (BeginTx, as inTx did)
	// sends its BEGIN alone, and this log sees it.
	log.reset()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '1234ms'"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := log.roundTrips(); got != 3 || !strings.HasPrefix(log.alone[0], "BEGIN") {
		t.Errorf("control: round trips = %d (alone %q), want 3 starting with BEGIN alone", got, log.alone)
	}
}

// Whatever the first statement is — an exec, a query read to its end or closed early, a row, a
// batch — its results read as in a plain transaction, the rest of the transaction follows on the
// same connection, and the connection goes back to the pool clean, after a commit and after a
// rollback. In every query mode DATABASE_URL may choose (default_query_exec_mode: exec and
// simple_protocol are what pgbouncer setups use).
func TestTransactionFirstStatementOfEveryKind(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) { firstStatementOfEveryKind(t, mode) })
	}
}

func firstStatementOfEveryKind(t *testing.T, mode pgx.QueryExecMode) {
	ctx := context.Background()
	svc, pool, _ := tracedService(t, time.Second, mode)
	insert := `INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, now(), now())`
	firsts := map[string]func(tx pgx.Tx, id string) error{
		"exec": func(tx pgx.Tx, id string) error {
			tag, err := tx.Exec(ctx, insert, id)
			if err == nil && tag.RowsAffected() != 1 {
				err = errors.New("exec: no row")
			}
			return err
		},
		"query collected": func(tx pgx.Tx, id string) error {
			rows, err := tx.Query(ctx, insert+` RETURNING order_id`, id)
			if err != nil {
				return err
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err == nil && (len(got) != 1 || got[0] != id) {
				err = errors.New("query: wrong rows")
			}
			return err
		},
		"query read to the end, not closed": func(tx pgx.Tx, id string) error {
			rows, err := tx.Query(ctx, insert+` RETURNING order_id`, id)
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() {
				n++
			}
			if n != 1 {
				return errors.New("query: wrong rows")
			}
			return rows.Err()
		},
		"row": func(tx pgx.Tx, id string) error {
			var got string
			return tx.QueryRow(ctx, insert+` RETURNING order_id`, id).Scan(&got)
		},
		"batch": func(tx pgx.Tx, id string) error {
			var b pgx.Batch
			b.Queue(insert, id)
			var n int
			b.Queue(`SELECT count(*) FROM orders WHERE order_id = $1`, id).QueryRow(func(r pgx.Row) error { return r.Scan(&n) })
			if err := tx.SendBatch(ctx, &b).Close(); err != nil {
				return err
			}
			if n != 1 {
				return errors.New("batch: the insert is not visible to the next statement")
			}
			return nil
		},
	}
	errAbort := errors.New("abort")
	i := 0
	for name, first := range firsts {
		i++
		for _, commit := range []bool{true, false} {
			id := fmt.Sprintf("tx-%d-%v", i, commit)
			err := svc.inTx(ctx, "test", func(tx pgx.Tx) error {
				if err := first(tx, id); err != nil {
					return err
				}
				// The transaction goes on: a second statement sees the first one's row.
				var n int
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = $1`, id).Scan(&n); err != nil || n != 1 {
					return errors.Join(err, errors.New("second statement does not see the first"))
				}
				if !commit {
					return errAbort
				}
				return nil
			})
			if commit && err != nil || !commit && !errors.Is(err, errAbort) {
				t.Fatalf("%s (%s): %v", name, id, err)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = $1`, id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1, false: 0}[commit]; n != want {
				t.Errorf("%s (%s): %d rows after the transaction, want %d", name, id, n, want)
			}
			if st := pool.Stat(); st.AcquiredConns() != 0 {
				t.Errorf("%s (%s): %d connections still held", name, id, st.AcquiredConns())
			}
		}
	}
}

// A first statement that fails — an error, a lock wait that runs out — fails the transaction
// with the server's error, rolls back and leaves the connection usable. The lock wait proves
// SET LOCAL lock_timeout is in force for the very statement it travels with.
func TestTransactionFirstStatementFails(t *testing.T) {
	ctx := context.Background()
	svc, pool, _ := tracedService(t, 50*time.Millisecond)
	if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) VALUES ('held', now(), now())`); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = 'held' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	for name, first := range map[string]func(tx pgx.Tx) error{
		"division by zero": func(tx pgx.Tx) error { var n int; return tx.QueryRow(ctx, `SELECT 1/0`).Scan(&n) },
		"lock wait": func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = 'held' FOR UPDATE`)
			return err
		},
		"batch lock wait": func(tx pgx.Tx) error {
			var b pgx.Batch
			b.Queue(`SELECT 1 FROM orders WHERE order_id = 'held' FOR UPDATE`)
			return tx.SendBatch(ctx, &b).Close()
		},
	} {
		err := svc.inTx(ctx, "test", first)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			t.Fatalf("%s: err = %v, want the server's error", name, err)
		}
		if want := map[bool]string{true: "22012", false: "55P03"}[name == "division by zero"]; pe.Code != want {
			t.Errorf("%s: SQLSTATE %s, want %s", name, pe.Code, want)
		}
		if st := pool.Stat(); st.AcquiredConns() != 1 { // the holder's
			t.Errorf("%s: %d connections held, want only the holder's", name, st.AcquiredConns())
		}
	}
	// A transaction that sends nothing never reaches the server.
	before := pool.Stat().AcquireCount()
	if err := svc.inTx(ctx, "test", func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := pool.Stat().AcquireCount() - before; got != 0 {
		t.Errorf("an empty transaction acquired %d connections", got)
	}
}

// commitWith sends a transaction's last batch with its COMMIT: a transaction of one batch is one
// round trip, and what it wrote is committed when the round trip ends. Control: the same batch
// sent with SendBatch needs its COMMIT in a round trip of its own.
func TestTransactionCommitsWithItsLastBatch(t *testing.T) {
	ctx := context.Background()
	svc, pool, log := tracedService(t, time.Second)
	insert := `INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, now(), now())`
	for _, with := range []bool{true, false} {
		log.reset()
		id := fmt.Sprintf("commit-with-%v", with)
		err := svc.inTx(ctx, "test", func(tx pgx.Tx) error {
			var b pgx.Batch
			b.Queue(insert, id)
			if with {
				return commitWith(ctx, tx, &b)
			}
			return tx.SendBatch(ctx, &b).Close()
		})
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]int{true: 1, false: 2}[with]
		if got := log.roundTrips(); got != want {
			t.Errorf("commitWith %v: %d round trips (alone %q, pipelines %q), want %d", with, got, log.alone, log.batches, want)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = $1`, id).Scan(&n); err != nil || n != 1 {
			t.Errorf("commitWith %v: %d rows committed (%v), want 1", with, n, err)
		}
		if st := pool.Stat(); st.AcquiredConns() != 0 {
			t.Errorf("commitWith %v: %d connections still held", with, st.AcquiredConns())
		}
	}
}

// A statement of the last batch that fails stops the pipeline before its COMMIT: nothing the
// transaction wrote, in that batch or before it, is committed, and the connection comes back
// clean.
func TestTransactionCommitWithRollsBackOnAFailure(t *testing.T) {
	ctx := context.Background()
	svc, pool, _ := tracedService(t, time.Second)
	err := svc.inTx(ctx, "test", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) VALUES ('before', now(), now())`); err != nil {
			return err
		}
		var b pgx.Batch
		b.Queue(`INSERT INTO orders (order_id, created_at, updated_at) VALUES ('in-the-batch', now(), now())`)
		b.Queue(`INSERT INTO orders (order_id, created_at, updated_at) VALUES ('not an id, ; spaces', now(), now())`) // CHECK fails
		return commitWith(ctx, tx, &b)
	})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" {
		t.Fatalf("err = %v, want the CHECK violation", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id IN ('before', 'in-the-batch')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows of the failed transaction committed (%v)", n, err)
	}
	if st := pool.Stat(); st.AcquiredConns() != 0 {
		t.Errorf("%d connections still held", st.AcquiredConns())
	}
	if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&n); err != nil {
		t.Fatalf("the pool after the failure: %v", err)
	}
}

// The patrol's claim is one round trip: BEGIN, SET LOCAL, the claim and COMMIT in one pipeline.
func TestPatrolClaimIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	svc, pool, log := tracedService(t, time.Second)
	svc.cfg.ReplicaID = "claimer"
	for i := range 3 {
		order := fmt.Sprintf("due-%d", i)
		if _, err := pool.Exec(ctx, `WITH o AS (INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, now(), now()))
			INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, next_check_at, created_at, updated_at)
			VALUES (gen_random_uuid(), $1, 100, 'EUR', 'Unknown', 'fake', now() - interval '1 minute', now(), now())`, order); err != nil {
			t.Fatal(err)
		}
	}
	log.reset()
	claimed, err := svc.claimDue(ctx, 10)
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claimed %d, %v; want 3", len(claimed), err)
	}
	if got := log.roundTrips(); got != 1 {
		t.Errorf("the claim took %d round trips (alone %q, pipelines %q), want 1", got, log.alone, log.batches)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payment_sessions WHERE lease_owner = 'claimer' AND lease_token IS NOT NULL`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d leases committed (%v), want 3", n, err)
	}
}

// A Create that is not a first attempt reads the order's active session without a lock first
// (the hot order). For a new order, that read also learns whether a claim of the order is open
// (activeOrOpenClaimSQL), so the checkout's first Create of an order pays nothing for the storm's
// shared wait: the read, the claim's pipeline, the insert with COMMIT — three round trips.
// Control: waiting for an open claim after every miss (commit c874a13, reverted) made it four.
//
// And the three go over one connection, taken from the pool once: a claim that gave its
// connection back after the read queued again behind every request waiting for the pool — in
// make bench's duplicate storm, behind the very duplicates waiting for it (p99 up to 117 ms with
// 200 Creates on 20 connections; 23-36 ms on one). Control: acquiring for each step, 3 acquires.
func TestClaimOfANewOrderIsThreeRoundTripsOnOneConnection(t *testing.T) {
	svc, pool, log := tracedService(t, time.Second)
	svc.gw = namedGateway{}
	log.reset()
	acquires := pool.Stat().AcquireCount()
	sess, created, err := svc.claim(context.Background(), Actor{Kind: ActorCustomer, ID: "test"},
		CreateInput{OrderID: "new-order", Amount: 1000, Currency: "EUR"})
	if err != nil || !created {
		t.Fatalf("claim: %+v created=%v, %v", sess, created, err)
	}
	if got := log.roundTrips(); got != 3 {
		t.Errorf("a new order's claim took %d round trips (alone %q, pipelines %q), want 3", got, log.alone, log.batches)
	}
	if got := pool.Stat().AcquireCount() - acquires; got != 1 {
		t.Errorf("the claim took a connection from the pool %d times, want once", got)
	}
}

// namedGateway is a gateway that is only a name: enough for a claim, which calls nobody.
type namedGateway struct{ Gateway }

func (namedGateway) Name() string { return "fake" }

// A keyless Create of a new order through Idempotency.Run completes its intent key in the
// claim's transaction, with the session: 5 round trips for the whole request (the key's insert,
// the claim's two, the apply's two) where completing the key after the Create took a sixth. The
// control is the same request whose effect does not pass the binding on (as a refund's does not):
// Run completes the key alone afterwards.
func TestIntentKeyCompletesWithTheClaim(t *testing.T) {
	svc, pool, log := tracedService(t, time.Second)
	svc.gw = registeringGateway{}
	x := NewIdempotency(svc, IdempotencyConfig{})
	const client = "00000000-0000-4000-8000-000000000001"
	if _, err := pool.Exec(context.Background(), `INSERT INTO api_clients (id, name, key_prefix, key_hash, scopes, created_at)
		VALUES ($1, 'shop', 'pl_000000000001', sha256('k'), '{payments:write}', now())`, client); err != nil {
		t.Fatal(err)
	}
	create := func(order string, bind bool) (string, int) {
		t.Helper()
		in := CreateInput{OrderID: order, Amount: 1000, Currency: "EUR"}
		r := IdempotencyRequest{ClientID: client, Kind: IdempotencyIntentKey, Method: "POST", Path: "/p/" + order,
			Key: IntentKey(in.OrderID, in.Amount, in.Currency), BusyRunsEffect: true}
		r.Fingerprint = Fingerprint(r.Method, r.Path, []byte(r.Key))
		log.reset()
		out, err := x.Run(context.Background(), r, func(ctx context.Context, slot Slot) (string, int, error) {
			in.FirstAttempt = slot.Fresh
			if bind {
				in.Bind = slot.Binding
			}
			res, err := svc.Create(ctx, Actor{Kind: ActorAPI, ID: client}, in)
			return res.Session.ID, 201, err
		})
		if err != nil || out.Replayed {
			t.Fatalf("create %s: %+v, %v", order, out, err)
		}
		rt := log.roundTrips()
		var resource string
		if err := pool.QueryRow(context.Background(), `SELECT resource_id::text FROM idempotency_keys
			WHERE client_id = $1 AND key = $2 AND completed_at IS NOT NULL AND lock_token IS NULL`, client, r.Key).Scan(&resource); err != nil {
			t.Fatalf("%s: the intent key is not completed: %v", order, err)
		}
		if resource != out.ResourceID {
			t.Fatalf("%s: the key points at %s, the Create made %s", order, resource, out.ResourceID)
		}
		return resource, rt
	}
	if _, rt := create("bound", true); rt != 5 {
		t.Errorf("a keyless Create with its key bound in the claim took %d round trips (alone %q, pipelines %q), want 5",
			rt, log.alone, log.batches)
	}
	if _, rt := create("unbound", false); rt != 7 {
		t.Errorf("the control (key completed after the Create, in a transaction of its own: execBounded) took %d round trips, want 7", rt)
	}
}

// registeringGateway registers every payment at once, pending the customer.
type registeringGateway struct{ namedGateway }

func (registeringGateway) Register(_ context.Context, req RegisterRequest) (GatewayPayment, error) {
	return GatewayPayment{ID: "gp-" + req.Reference, Status: GatewayPending, Amount: req.Amount, Currency: req.Currency,
		Reference: req.Reference, ConfirmationURL: "https://gw.example/pay/" + req.Reference}, nil
}

// A core transaction whose client goes quiet between two statements (its replica's host lost:
// no FIN, no RST reaches the server) is ended by the server after IdleInTransactionTimeout, and
// its row locks with it. Before, the backend stayed idle in transaction, the order's and the
// session's rows locked, until the server's TCP keepalive gave up: two hours by default (an
// outside review).
func TestAQuietTransactionIsEndedByTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	svc := NewService(pool, Config{IdleInTransactionTimeout: 200 * time.Millisecond})
	if _, err := pool.Exec(ctx, `CREATE TABLE quiet (id int PRIMARY KEY); INSERT INTO quiet VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	err := svc.inTx(ctx, "test", func(tx pgx.Tx) error {
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM quiet WHERE id = 1 FOR UPDATE`).Scan(&pid); err != nil {
			return err
		}
		// The client goes quiet, the row locked: the server ends its session.
		for deadline := time.Now().Add(30 * time.Second); ; {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the quiet transaction is still open after 30 s")
			}
		}
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	})
	if err == nil {
		t.Fatal("the transaction went on after the server ended it")
	}
	if _, err := pool.Exec(ctx, `SELECT 1 FROM quiet FOR UPDATE NOWAIT`); err != nil {
		t.Fatalf("the row is still locked: %v", err)
	}
}

// quietAfterOrderRead is a pgx tracer that, once GetOrder's read of the order has ended, keeps
// its client quiet (a replica's host lost between the transaction's two reads) until the
// server has ended that connection's session or 30 s have passed.
type quietAfterOrderRead struct {
	watch *pgxpool.Pool // another pool, to look at pg_stat_activity
	once  sync.Once     // only the first read goes quiet
	ended chan bool     // whether the server ended the quiet session
}

func (q *quietAfterOrderRead) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (q *quietAfterOrderRead) TraceQueryEnd(_ context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	if d.Err == nil && strings.HasPrefix(d.CommandTag.String(), "SELECT") {
		q.once.Do(func() { q.ended <- q.wait(conn.PgConn().PID()) })
	}
}

func (q *quietAfterOrderRead) wait(pid uint32) bool {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		var n int
		if err := q.watch.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil || n == 0 {
			return err == nil
		}
	}
	return false
}

// GetOrder's REPEATABLE READ transaction bounds its idle time on the server too: a client quiet
// between its two reads is ended after IdleInTransactionTimeout. Before, it had no bound (the
// core's and access's transactions had one): the backend kept its snapshot and its tables' locks
// until the server's TCP keepalive gave up.
func TestAQuietOrderReadIsEndedByTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.NewURL(t)
	watch, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)
	if _, err := watch.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) VALUES ('quiet', now(), now())`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	quiet := &quietAfterOrderRead{watch: watch, ended: make(chan bool, 1)}
	cfg.ConnConfig.Tracer = quiet
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc := NewService(pool, Config{IdleInTransactionTimeout: 200 * time.Millisecond})
	_, _, err = svc.GetOrder(ctx, "quiet")
	if !<-quiet.ended {
		t.Fatal("the quiet order read is still open after 30 s")
	}
	if err == nil {
		t.Fatal("GetOrder went on after the server ended its transaction")
	}
}
