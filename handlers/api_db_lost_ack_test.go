package handlers_test

// The database failing under an API request (an outside review, dbfail): a COMMIT (or an
// autocommit statement) the server executed and committed whose answer never reaches the
// replica — a failover behind pgbouncer, a connection reset — and an outage that fails the
// request and its key's last write alike. ackDropper cuts a replica's connection right after the
// server's answer carrying the commit arrived and hands pgx an error instead (a reset, or
// pgbouncer's FATAL 08P01): the transaction committed, the client saw a broken connection.

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
)

// ackDropper drops one answer of a watched connection (arm) or makes the database unreachable
// (setDown) for the connections of droppingPool.
type ackDropper struct {
	mu       sync.Mutex
	write    []byte // a connection that wrote this is watched (nil: every connection)
	read     []byte // a watched connection's answer carrying this is dropped
	armed    bool
	skip     int  // answers carrying read to let through before dropping one
	down     bool // the database is unreachable: no connection, no write
	asPgErr  bool // answer as pgbouncer does when its server connection died: FATAL 08P01
	closed   map[*dropConn]bool
	dropped  int
	watching map[*dropConn]bool
	then     [2]string // once an answer is dropped, arm(then[0], then[1]) when set
}

func (d *ackDropper) arm(write, read string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.write, d.read, d.armed = nil, []byte(read), true
	if write != "" {
		d.write = []byte(write)
	}
	d.watching = map[*dropConn]bool{}
}

func (d *ackDropper) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped
}

type dropConn struct {
	net.Conn
	d *ackDropper
}

func (d *ackDropper) setDown(down bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = down
}

func (c *dropConn) Write(p []byte) (int, error) {
	c.d.mu.Lock()
	if c.d.down {
		c.d.mu.Unlock()
		c.Conn.Close()
		return 0, syscall.ECONNRESET
	}
	if c.d.armed && c.d.write != nil && bytes.Contains(p, c.d.write) {
		c.d.watching[c] = true
	}
	c.d.mu.Unlock()
	return c.Conn.Write(p)
}

var readyForQuery = []byte{'Z', 0, 0, 0, 5}

func (c *dropConn) Read(p []byte) (int, error) {
	c.d.mu.Lock()
	if c.d.closed[c] {
		c.d.mu.Unlock()
		return 0, io.EOF
	}
	c.d.mu.Unlock()
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if !c.d.armed || (c.d.write != nil && !c.d.watching[c]) || !bytes.Contains(p[:n], c.d.read) {
		return n, err
	}
	if c.d.skip > 0 {
		c.d.skip--
		return n, err
	}
	// The server has answered (and so committed): read its answer to the end of the pipeline,
	// then lose it.
	buf := append([]byte(nil), p[:n]...)
	for !bytes.Contains(buf[bytes.Index(buf, c.d.read):], readyForQuery) {
		tmp := make([]byte, 8192)
		m, rerr := c.Conn.Read(tmp)
		buf = append(buf, tmp[:m]...)
		if rerr != nil {
			break
		}
	}
	c.d.armed = false
	c.d.dropped++
	if c.d.then != [2]string{} {
		c.d.write, c.d.read, c.d.armed, c.d.watching = []byte(c.d.then[0]), []byte(c.d.then[1]), true, map[*dropConn]bool{}
		c.d.then = [2]string{}
	}
	c.Conn.Close()
	if c.d.asPgErr {
		if c.d.closed == nil {
			c.d.closed = map[*dropConn]bool{}
		}
		c.d.closed[c] = true
		body := []byte("SFATAL\x00VFATAL\x00C08P01\x00Mserver conn crashed?\x00\x00")
		msg := append([]byte{'E', 0, 0, 0, 0}, body...)
		l := len(body) + 4
		msg[1], msg[2], msg[3], msg[4] = byte(l>>24), byte(l>>16), byte(l>>8), byte(l)
		return copy(p, msg), nil
	}
	return 0, syscall.ECONNRESET
}

// droppingPool is a pool on b's database whose connections go through d.
func droppingPool(t *testing.T, b *apiBench, d *ackDropper) *pgxpool.Pool {
	t.Helper()
	cfg := b.pool.Config().Copy()
	var dialer net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.mu.Lock()
		down := d.down
		d.mu.Unlock()
		if down {
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &dropConn{Conn: c, d: d}, nil
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// commandComplete is the server's CommandComplete message for tag.
func commandComplete(tag string) string {
	n := 4 + len(tag) + 1
	return string([]byte{'C', 0, 0, byte(n >> 8), byte(n)}) + tag + "\x00"
}

// letGo is an IdempotencyConfig whose background let-go of a key (retryLater) reports on the
// returned channel.
func letGo() (payments.IdempotencyConfig, chan error) {
	done := make(chan error, 8)
	return payments.IdempotencyConfig{Hooks: payments.IdempotencyHooks{AfterLetGo: func(_, _ string, err error) {
		select {
		case done <- err:
		default:
		}
	}}}, done
}

// wantLetGo waits for the key's background let-go, which must have written.
func wantLetGo(t *testing.T, done chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the key was not let go of: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the key was never let go of")
	}
}

// The key's first write (Acquire's autocommit INSERT) committed and its answer was lost: the
// request answered 503 "try again", nothing ran, and the same request again was refused 409
// "still in progress" until StaleAfter (30 s; 20 minutes at the longest GATEWAY_TIMEOUT). The
// request lets go of its key by its token in the background. Negative control (run by hand):
// without abandonLater, the retry is a 409.
func TestALostKeyInsertAnswerDoesNotHoldTheKey(t *testing.T) {
	t.Parallel()
	idem, done := letGo()
	b := newAPIBench(t)
	d := &ackDropper{}
	_, eB := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{idem: idem})
	req := post(createPath("lost-key-ack"), `{"amount":1000,"currency":"EUR"}`, "Idempotency-Key", "k-lost-insert")

	d.arm("INSERT INTO idempotency_keys", commandComplete("INSERT 0 1"))
	if first := b.on(eB, req); d.count() != 1 || first.Code != http.StatusServiceUnavailable {
		t.Fatalf("first request (its key's INSERT committed, answer lost): %d %s (dropped %d)", first.Code, first.Body, d.count())
	}
	wantLetGo(t, done)
	again := b.on(b.e, req)
	if p := wantPayment(t, again, http.StatusCreated); p.Status != "Registered" || b.sessions(t) != 1 {
		t.Fatalf("the same request again: %+v, %d sessions; want it run (one session, registered)", p, b.sessions(t))
	}
}

// An outage from the middle of a keyed Create on: its claim never committed, and giving its key
// up failed too (the database still away). Once the database was back, the same request was
// refused 409 until StaleAfter, though nothing ran for the key. Giving up is tried again in the
// background. Negative control (run by hand): tried once, a 409.
func TestAnOutageDuringACreateDoesNotHoldItsKey(t *testing.T) {
	t.Parallel()
	idem, done := letGo()
	b := newAPIBench(t)
	d := &ackDropper{}
	_, eB := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{idem: idem, core: func(c *payments.Config) {
		c.Hooks.AfterClaimRead = func(context.Context, string) { d.setDown(true) }
	}})
	req := post(createPath("failover"), `{"amount":1000,"currency":"EUR"}`, "Idempotency-Key", "k-failover")
	if first := b.on(eB, req); first.Code != http.StatusServiceUnavailable || b.sessions(t) != 0 {
		t.Fatalf("first request (an outage from its claim on): %d %s, %d sessions", first.Code, first.Body, b.sessions(t))
	}
	d.setDown(false) // the new primary is up
	wantLetGo(t, done)
	again := b.on(b.e, req)
	if p := wantPayment(t, again, http.StatusCreated); p.Status != "Registered" || b.sessions(t) != 1 {
		t.Fatalf("the same request after the outage: %+v, %d sessions; want it run", p, b.sessions(t))
	}
}

// Create's claim (the session and the key's binding, COMMIT in its pipeline) committed and its
// answer was lost: the claim is read back by the session's id and the Create goes on — the
// session is registered now and answered 201 (it was 503, and the same key's retry replayed the
// session Registering until the patrol registered it after RegisterGrace); the same request
// again, keyed or keyless, replays that session, never a second one or a second registration.
// Negative control (run by hand): without sessionClaimedAfterAll, 503.
func TestAClaimWhoseAnswerWasLostGoesOn(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	d := &ackDropper{}
	_, eB := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{core: func(c *payments.Config) {
		c.Hooks.AfterClaimRead = func(context.Context, string) { d.arm("", commandComplete("COMMIT")) }
	}})
	for i, req := range []call{
		post(createPath("lost-claim-ack"), `{"amount":1000,"currency":"EUR"}`, "Idempotency-Key", "k-lost-claim"),
		post(createPath("lost-claim-ack-keyless"), `{"amount":1000,"currency":"EUR"}`), // keyless: the intent
	} {
		first := b.on(eB, req)
		if d.count() != i+1 {
			t.Fatalf("request %d: the claim's COMMIT answer was not dropped; %d %s", i, first.Code, first.Body)
		}
		p := wantPayment(t, first, http.StatusCreated)
		if p.Status != "Registered" || b.sessions(t) != i+1 || b.gw.Calls("register") != i+1 {
			t.Fatalf("request %d (claim committed, answer lost): %+v, %d sessions, %d registrations; want it registered now",
				i, p, b.sessions(t), b.gw.Calls("register"))
		}
		again := b.on(b.e, req)
		if again.Code/100 != 2 {
			t.Fatalf("retry %d: %d %s; want the one session replayed", i, again.Code, again.Body)
		}
		if r := wantPayment(t, again, again.Code); r.ID != p.ID || b.sessions(t) != i+1 || b.gw.Calls("register") != i+1 {
			t.Fatalf("retry %d: %d %+v, %d sessions, %d registrations; want the one session replayed",
				i, again.Code, r, b.sessions(t), b.gw.Calls("register"))
		}
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE resource_id IS NULL`); n != 0 {
		t.Errorf("%d keys without their session", n)
	}
}

// The same claim read back, but the transaction that confirms it is on the standbys
// (confirmDurable: a commit waits for them up to its own WAL, past the claim's) is not
// acknowledged: a claim committed on the old primary alone (PostgreSQL's 57P01 after it stopped
// waiting for its standby) is lost with a failover, and sent on, the gateway held a payment
// pitlane did not know (a review of the read-back). The Create answers 503 and sends nothing;
// the patrol takes the session up if it survives. Negative control (run by hand): without
// confirmDurable, 201 and a registration.
func TestAClaimReadBackNotKnownOnTheStandbysIsNotSent(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	d := &ackDropper{then: [2]string{"pg_logical_emit_message", commandComplete("SELECT 1")}}
	_, eB := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{core: func(c *payments.Config) {
		c.Hooks.AfterClaimRead = func(context.Context, string) {
			d.mu.Lock()
			then := d.then
			d.mu.Unlock()
			d.arm("", commandComplete("COMMIT"))
			d.mu.Lock()
			d.then = then
			d.mu.Unlock()
		}
	}})
	rec := b.on(eB, post(createPath("lost-claim-not-durable"), `{"amount":1000,"currency":"EUR"}`, "Idempotency-Key", "k-not-durable"))
	if d.count() != 2 {
		t.Fatalf("%d answers dropped, want the claim's COMMIT and the confirmation's; %d %s", d.count(), rec.Code, rec.Body)
	}
	if rec.Code != http.StatusServiceUnavailable || b.gw.Calls("register") != 0 {
		t.Fatalf("a claim not known on the standbys: %d %s, %d registrations; want 503 and nothing sent", rec.Code, rec.Body, b.gw.Calls("register"))
	}
}

// Create's apply of the gateway's registration committed and its answer was lost: the shop was
// told 503 while pitlane and the gateway held its payment (Registered), and the same key's
// retry replayed it as 200, "already existed". Create answers the session as it is now, as a
// refund whose apply failed is, and a replay whose first answer was never recorded answers as
// that request would have. Negative controls (run by hand): without the read-back, 503; with a
// replay of an unrecorded answer as 200, the retry's status.
func TestACreateWhoseApplyAnswerWasLostAnswersItsSession(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	d := &ackDropper{}
	_, eB := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{core: func(c *payments.Config) {
		c.Hooks.BeforeRegister = func(context.Context, string) { d.arm("", commandComplete("COMMIT")) }
	}})
	req := post(createPath("lost-apply-ack"), `{"amount":1000,"currency":"EUR"}`, "Idempotency-Key", "k-lost-apply")
	first := b.on(eB, req)
	if d.count() != 1 {
		t.Fatalf("the apply's COMMIT answer was not dropped; first answer %d %s", first.Code, first.Body)
	}
	if p := wantPayment(t, first, http.StatusCreated); p.Status != "Registered" {
		t.Fatalf("the Create whose apply committed: %+v, want its session Registered", p)
	}
	if n := b.count(t, `SELECT count(*) FROM gateway_calls WHERE operation = 'register'`); n != 1 {
		t.Errorf("%d register call rows, want 1", n)
	}

	// A key whose request's answer was never recorded (its replica died after the claim): the
	// replay answers as that request would have, 202 while Registering.
	if _, err := b.pool.Exec(context.Background(), `UPDATE idempotency_keys SET response_code = NULL`); err != nil {
		t.Fatal(err)
	}
	again := b.on(b.e, req)
	if p := wantPayment(t, again, http.StatusCreated); p.Status != "Registered" || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %+v, want 201 replayed", again.Code, p)
	}
}

// Behind pgbouncer a COMMIT whose server connection died is answered with an ErrorResponse
// (FATAL 08P01 "server conn crashed?"), and PostgreSQL answers FATAL 57P01 after it stopped
// waiting for synchronous replication, having committed locally: a PgError, though the apply
// may have committed. It was read as "the server refused before the COMMIT", and the gateway
// call's row, which the committed apply carried, was written a second time. Negative control
// (run by hand): every PgError read as refused, two rows.
func TestAConnectionsEndAtCommitIsNotReadAsRolledBack(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	d := &ackDropper{asPgErr: true}
	_, eB := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{core: func(c *payments.Config) {
		c.Hooks.BeforeRegister = func(context.Context, string) { d.arm("", commandComplete("COMMIT")) }
	}})
	first := b.on(eB, post(createPath("pgerr-commit"), `{"amount":1000,"currency":"EUR"}`, "Idempotency-Key", "k-pgerr"))
	if d.count() != 1 {
		t.Fatalf("not dropped; %d %s", first.Code, first.Body)
	}
	if n := b.count(t, `SELECT count(*) FROM gateway_calls WHERE operation = 'register'`); n != 1 {
		t.Errorf("%d gateway_calls rows for one register call (the apply that carried it committed)", n)
	}
}

// The API refund's claim (the Pending refund and the key's recorded resource) committed and its
// answer was lost: the claim is read back by its id and the request goes on — the refund is sent
// now and answered (it was 503, the gateway hearing of it only from the patrol after its grace);
// the same request again, keyed or keyless, replays that refund, never a second one.
func TestARefundClaimWhoseAnswerWasLostGoesOn(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	d := &ackDropper{}
	_, eB := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{core: func(c *payments.Config) {
		c.Hooks.AfterRefundLock = func(context.Context, string) { d.arm("", commandComplete("COMMIT")) }
	}})
	p := b.completedPayment(t, "refund-lost-claim", 1000)
	for i, req := range []call{
		post(refundsPath(p.ID), `{"amount":400}`, "Idempotency-Key", "r-lost-claim"),
		post(refundsPath(p.ID), `{"amount":300}`), // keyless: the intent
	} {
		first := b.on(eB, req)
		if d.count() != i+1 || first.Code != http.StatusCreated || b.gw.Calls("refund") != i+1 {
			t.Fatalf("request %d (claim committed, answer lost): %d %s, %d sent; want 201, the refund sent now",
				i, first.Code, first.Body, b.gw.Calls("refund"))
		}
		if again := b.on(b.e, req); again.Code/100 != 2 || b.refunds(t) != i+1 || b.gw.Calls("refund") != i+1 {
			t.Fatalf("retry %d: %d %s, %d refunds, %d sent; want the one refund replayed",
				i, again.Code, again.Body, b.refunds(t), b.gw.Calls("refund"))
		}
	}
}

// The refund's apply (Succeeded, its RefundIssued entry) committed and its answer was lost: the
// money went back, and the client is told so (settleRefund reads the refund back), not 5xx.
func TestARefundApplyWhoseAnswerWasLostAnswersTheRefund(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	d := &ackDropper{}
	_, eB := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{core: func(c *payments.Config) {
		// The claim's COMMIT and the call log's go through; the apply's answer is lost.
		c.Hooks.AfterRefundLock = func(context.Context, string) { d.arm("", commandComplete("COMMIT")); d.skip = 2 }
	}})
	p := b.completedPayment(t, "refund-lost-apply", 1000)
	first := b.on(eB, post(refundsPath(p.ID), `{"amount":400}`, "Idempotency-Key", "r-lost-apply"))
	if d.count() != 1 {
		t.Fatalf("not dropped; %d %s", first.Code, first.Body)
	}
	if first.Code != http.StatusCreated || b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`) != 1 {
		t.Fatalf("the refund whose apply committed: %d %s; want 201 with its one RefundIssued entry", first.Code, first.Body)
	}
}
