package payments_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/access"
	"pitlane/payments"
)

// waitAdvisoryWaiters waits until n backends of THIS database wait for an advisory lock of the
// namespace: the exact place the protocol says a concurrent acquisition must block (pg_locks is
// cluster-wide; other tests' waits must not count).
func waitAdvisoryWaiters(t *testing.T, pool *pgxpool.Pool, ns payments.LockNamespace, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var waiting int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
			WHERE NOT granted AND locktype = 'advisory' AND classid = $1
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, int32(ns)).Scan(&waiting); err != nil {
			t.Fatalf("pg_locks: %v", err)
		}
		if waiting >= n {
			return
		}
	}
	t.Fatalf("no %d backends ever waited for an advisory lock of namespace %d", n, ns)
}

func newClient(t *testing.T, b *bench, name string) access.APIClient {
	t.Helper()
	c, _, err := access.New(b.pool, b.clock).CreateAPIClient(context.Background(), payments.Staff{Email: "test@example.com", Role: "admin"}, name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func idemReq(client, key, body string) payments.IdempotencyRequest {
	path := "/api/v1/orders/o/payments"
	return payments.IdempotencyRequest{ClientID: client, Kind: payments.IdempotencyClientKey, Key: key,
		Method: "POST", Path: path, Fingerprint: payments.Fingerprint("POST", path, []byte(body))}
}

// waitBlockedBy waits until a backend of this database is blocked by the backend holder
// (pg_blocking_pids) and returns its pid: how a test knows a concurrent statement waits exactly
// where the protocol says it must.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, holder int32) int32 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var pid int32
		err := pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND $1::int = ANY(pg_blocking_pids(pid)) LIMIT 1`, holder).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("pg_blocking_pids: %v", err)
		}
	}
	t.Fatalf("no backend was ever blocked by backend %d", holder)
	return 0
}

// acquireResult is one request's answer in a race: it owns the key (a token) or not.
type acquireResult struct {
	token string
	err   error
}

// raceFreshKey builds the one race a fresh key has: request A's INSERT has written the key's row
// and not committed yet when request B inserts the same key. A is parked inside its INSERT on
// the key's client row, which the test holds FOR UPDATE and the INSERT's foreign key check must
// share-lock (pg_blocking_pids: A waits for the test); B is started then and seen waiting for
// A's transaction (B's INSERT found A's uncommitted row). Then the test lets go: A commits, B
// goes on. acquire is the protocol under test.
func raceFreshKey(t *testing.T, b *bench, clientID string, acquire func(context.Context) acquireResult) (a, c acquireResult) {
	t.Helper()
	ctx := context.Background()
	holder, holderPID := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM api_clients WHERE id = $1 FOR UPDATE`, clientID); err != nil {
		t.Fatal(err)
	}
	run := func() <-chan acquireResult {
		ch := make(chan acquireResult, 1)
		go func() { ch <- acquire(ctx) }()
		return ch
	}
	first := run()
	firstPID := waitBlockedBy(t, b.pool, holderPID) // A's row is written, its INSERT not done
	second := run()
	waitBlockedBy(t, b.pool, firstPID) // B's INSERT waits for A's transaction
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return mustWait(t, first, "first acquisition"), mustWait(t, second, "second acquisition")
}

// Two requests acquire one fresh key at the same moment (a fresh key is one autocommit INSERT,
// no advisory lock): the second's INSERT waits for the first's row to commit, then finds the key
// in flight. Exactly one owner; the other is told the key's request still runs (409), for a
// client key and for a keyless request's intent key alike.
func TestIdempotencyAcquireIsAtomic(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	for _, r := range []payments.IdempotencyRequest{idemReq(cl.ID, "k1", `{"amount":1}`), intentReq(cl.ID, payments.IntentKey("o-1", 100, "EUR"))} {
		first, second := raceFreshKey(t, b, cl.ID, func(ctx context.Context) acquireResult {
			s, err := x.Acquire(ctx, r)
			return acquireResult{s.Token, err}
		})
		if first.err != nil || first.token == "" {
			t.Fatalf("%s: first = %+v, want the owner", r.Kind, first)
		}
		if payments.ErrorCode(second.err) != payments.EBUSY || second.token != "" {
			t.Fatalf("%s: second = %+v, want busy (409: the key's first request still runs)", r.Kind, second)
		}
		if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE kind = $1 AND key = $2 AND lock_token = $3`,
			string(r.Kind), r.Key, first.token); n != 1 {
			t.Fatalf("%s: rows held by the first = %d", r.Kind, n)
		}
	}
}

// naiveUpsertAcquire is the tempting one-statement acquire that gets this wrong: an upsert that
// takes any row not completed yet as free, so it never waits for a decision under the key's lock.
func naiveUpsertAcquire(ctx context.Context, pool *pgxpool.Pool, r payments.IdempotencyRequest) acquireResult {
	var token string
	err := pool.QueryRow(ctx, `INSERT INTO idempotency_keys (client_id, kind, key, fingerprint, method, path, lock_token, locked_until, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now() + interval '30 s', now(), now() + interval '30 days')
		ON CONFLICT (client_id, kind, key) DO UPDATE SET lock_token = excluded.lock_token, locked_until = excluded.locked_until
		WHERE idempotency_keys.completed_at IS NULL
		RETURNING lock_token::text`,
		r.ClientID, string(r.Kind), r.Key, r.Fingerprint, r.Method, r.Path, uuid.NewString()).Scan(&token)
	return acquireResult{token, err}
}

// The negative control of TestIdempotencyAcquireIsAtomic: under the same schedule the naive
// upsert gives both requests the key — both would run Create.
func TestIdempotencyNaiveUpsertDoubleOwns(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	r := idemReq(cl.ID, "k1", `{"amount":1}`)
	first, second := raceFreshKey(t, b, cl.ID, func(ctx context.Context) acquireResult { return naiveUpsertAcquire(ctx, b.pool, r) })
	if first.err != nil || second.err != nil || first.token == "" || second.token == "" {
		t.Fatalf("naive = %+v %+v, want both owners (the bug)", first, second)
	}
}

// A key that exists is decided under its advisory lock. Two requests take over one stale key
// (its request crashed) at the same moment: the first holds the lock while it decides, the
// second waits for it exactly there (pg_locks), then finds the key taken over and in flight.
func TestIdempotencyTakeoverIsAtomic(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	p := newParker()
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{Hooks: payments.IdempotencyHooks{AfterAcquireRead: p.hook}})
	r := idemReq(cl.ID, "k1", `{"amount":1}`)
	crashed, err := x.Acquire(context.Background(), r) // fresh: no transaction, the hook does not run
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(x.Config().StaleAfter)
	acquire := func() <-chan acquireResult {
		ch := make(chan acquireResult, 1)
		go func() { s, err := x.Acquire(context.Background(), r); ch <- acquireResult{s.Token, err} }()
		return ch
	}
	first := acquire()
	mustWait(t, p.arrived, "first acquisition's read")
	second := acquire()
	waitAdvisoryWaiters(t, b.pool, payments.LockIdempotencyKey, 1)
	p.let(1)
	r1 := mustWait(t, first, "first")
	if r1.err != nil || r1.token == "" || r1.token == crashed.Token {
		t.Fatalf("first = %+v, want a takeover", r1)
	}
	mustWait(t, p.arrived, "second acquisition's read")
	p.let(1)
	if r2 := mustWait(t, second, "second"); payments.ErrorCode(r2.err) != payments.EBUSY {
		t.Fatalf("second = %+v, want busy", r2)
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE lock_token = $1`, r1.token); n != 1 {
		t.Fatalf("rows held by the first = %d", n)
	}
}

// naiveAcquire is the bug the lock prevents: read the key, and if nobody holds it (or its holder
// went stale), write it as ours (an upsert, so the write itself never fails).
func naiveAcquire(ctx context.Context, pool *pgxpool.Pool, r payments.IdempotencyRequest, now time.Time, afterRead func(context.Context, string)) (bool, error) {
	var holder *string
	var until *time.Time
	err := pool.QueryRow(ctx, `SELECT lock_token::text, locked_until FROM idempotency_keys WHERE client_id = $1 AND kind = $2 AND key = $3`,
		r.ClientID, string(r.Kind), r.Key).Scan(&holder, &until)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, err
	}
	afterRead(ctx, r.Key)
	if holder != nil && until != nil && until.After(now) {
		return false, nil
	}
	_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys (client_id, kind, key, fingerprint, method, path, lock_token, locked_until, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8::timestamptz + interval '30 s', $8, $8::timestamptz + interval '30 days')
		ON CONFLICT (client_id, kind, key) DO UPDATE SET lock_token = excluded.lock_token, locked_until = excluded.locked_until`,
		r.ClientID, string(r.Kind), r.Key, r.Fingerprint, r.Method, r.Path, uuid.NewString(), now)
	return err == nil, err
}

// The negative control of TestIdempotencyTakeoverIsAtomic: under the same schedule (both read
// the stale key before either writes), the naive check-then-write lets both requests believe
// they own the key — both would run Create.
func TestIdempotencyNaiveAcquireDoubleOwns(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	p := newParker()
	r := idemReq(cl.ID, "k1", `{"amount":1}`)
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	if _, err := x.Acquire(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(x.Config().StaleAfter)
	owned := make(chan bool, 2)
	for range 2 {
		go func() {
			ok, err := naiveAcquire(context.Background(), b.pool, r, b.clock.Now(), p.hook)
			if err != nil {
				t.Error(err)
			}
			owned <- ok
		}()
	}
	mustWait(t, p.arrived, "first read")
	mustWait(t, p.arrived, "second read")
	p.let(2)
	if a, c := mustWait(t, owned, "naive 1"), mustWait(t, owned, "naive 2"); !a || !c {
		t.Fatalf("naive owners = %v %v, want both (the bug)", a, c)
	}
}

func TestIdempotencyLifecycle(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	same := idemReq(cl.ID, "k", `{"amount":1}`)
	other := idemReq(cl.ID, "k", `{"amount":2}`)

	s, err := x.Acquire(ctx, same)
	if err != nil || s.Token == "" || s.Done || !s.Fresh {
		t.Fatalf("acquire = %+v %v, want a fresh key held", s, err)
	}
	// Released (failed before any effect): the key is not burnt, another request may use it.
	if err := x.Release(ctx, same, s.Token); err != nil {
		t.Fatal(err)
	}
	s, err = x.Acquire(ctx, other)
	if err != nil || s.Token == "" {
		t.Fatalf("acquire after release = %+v %v", s, err)
	}
	// Abandoned (outcome uncertain): still bound to its request; the same one takes over at once.
	if err := x.Abandon(ctx, other, s.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Acquire(ctx, same); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("another request after abandon = %v, want invalid (422)", err)
	}
	s, err = x.Acquire(ctx, other)
	if err != nil || s.Token == "" || s.Fresh {
		t.Fatalf("same request after abandon = %+v %v, want the key taken over (not fresh: the abandoned request may have had an effect)", s, err)
	}
	sid := uuid.NewString()
	if err := x.Complete(ctx, other, s.Token, sid, 201); err != nil {
		t.Fatal(err)
	}
	// Completed: the same request replays; another one is refused.
	s, err = x.Acquire(ctx, other)
	if err != nil || !s.Done || s.ResourceID != sid || s.ResponseCode != 201 || s.Token != "" || s.Fresh {
		t.Fatalf("replay = %+v %v", s, err)
	}
	var e *payments.Error
	if _, err := x.Acquire(ctx, same); !errors.As(err, &e) || e.Code != payments.EINVALID || e.Field != "Idempotency-Key" {
		t.Fatalf("other request after completion = %v", err)
	}
	// Completing or releasing with a token that no longer holds the key changes nothing.
	if err := x.Release(ctx, other, s.Token); !errors.Is(err, payments.ErrIdempotencyLockLost) {
		t.Fatalf("release of a completed key = %v", err)
	}
}

// A request that crashed after acquiring leaves its lock behind: busy until the stale bound
// passes, then the same request takes it over, and the crashed one can no longer complete.
func TestIdempotencyStaleLockTakeover(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{StaleAfter: payments.StaleAfterFor(10 * time.Second)})
	if got := x.Config().StaleAfter; got != 30*time.Second {
		t.Fatalf("stale bound for a 10 s gateway timeout = %s, want 30s", got)
	}
	r := idemReq(cl.ID, "k", `{}`)
	crashed, err := x.Acquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(29 * time.Second)
	if _, err := x.Acquire(ctx, r); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("before the bound = %v, want busy", err)
	}
	if _, err := x.Acquire(ctx, idemReq(cl.ID, "k", `{"other":1}`)); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("another request while in flight = %v, want invalid", err)
	}
	b.clock.Advance(time.Second)
	taken, err := x.Acquire(ctx, r)
	if err != nil || !taken.TookOver || taken.Fresh || taken.Token == "" || taken.Token == crashed.Token {
		t.Fatalf("after the bound = %+v %v, want a takeover", taken, err)
	}
	if err := x.Complete(ctx, r, crashed.Token, uuid.NewString(), 201); !errors.Is(err, payments.ErrIdempotencyLockLost) {
		t.Fatalf("the crashed request's complete = %v, want lock lost", err)
	}
	if err := x.Complete(ctx, r, taken.Token, uuid.NewString(), 200); err != nil {
		t.Fatal(err)
	}
}

// The same key string of two clients names two independent keys.
func TestIdempotencyKeysScopedPerClient(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	a, c := newClient(t, b, "a"), newClient(t, b, "b")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	sa, err := x.Acquire(ctx, idemReq(a.ID, "shared", `{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := x.Acquire(ctx, idemReq(c.ID, "shared", `{"amount":2}`))
	if err != nil || sb.Token == "" {
		t.Fatalf("client b = %+v %v, want its own key", sb, err)
	}
	if err := x.Complete(ctx, idemReq(a.ID, "shared", `{"amount":1}`), sa.Token, uuid.NewString(), 201); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Acquire(ctx, idemReq(c.ID, "shared", `{"amount":2}`)); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("b's key must still be b's own in-flight key: %v", err)
	}
}

// Keys live 30 days; the reaper deletes expired ones in batches and leaves the rest. An expired
// key not reaped yet is as good as absent.
func TestReapIdempotencyKeys(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	for i := range 5 {
		r := idemReq(cl.ID, fmt.Sprintf("old-%d", i), `{}`)
		s, err := x.Acquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Complete(ctx, r, s.Token, uuid.NewString(), 201); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.Advance(29 * 24 * time.Hour)
	if _, err := x.Acquire(ctx, idemReq(cl.ID, "young", `{}`)); err != nil {
		t.Fatal(err)
	}
	if n, err := b.svc.ReapIdempotencyKeys(ctx, b.clock.Now(), 2); err != nil || n != 0 {
		t.Fatalf("reap at 29 days = %d %v, want 0", n, err)
	}
	// Day 30: the old keys expired. Before the reaper gets to one, Acquire already treats it as absent.
	b.clock.Advance(24 * time.Hour)
	s, err := x.Acquire(ctx, idemReq(cl.ID, "old-0", `{"a different":"request"}`))
	if err != nil || s.Token == "" || s.Done || !s.Fresh {
		t.Fatalf("expired key = %+v %v, want a fresh acquisition", s, err)
	}
	// The reaper keeps them for IdempotencyReapGrace: a request that read its time inside their
	// life may still be on its way to the database.
	if n, err := b.svc.ReapIdempotencyKeys(ctx, b.clock.Now(), 2); err != nil || n != 0 {
		t.Fatalf("reap at 30 days = %d %v, want 0 within the grace", n, err)
	}
	b.clock.Advance(payments.IdempotencyReapGrace)
	n, err := b.svc.ReapIdempotencyKeys(ctx, b.clock.Now(), 2)
	if err != nil || n != 4 {
		t.Fatalf("reap at 30 days and the grace = %d %v, want the 4 expired ones", n, err)
	}
	if got := b.count(t, `SELECT count(*) FROM idempotency_keys`); got != 2 {
		t.Fatalf("left = %d, want old-0 (renewed) and young", got)
	}
}

func TestIntentKeys(t *testing.T) {
	t.Parallel()
	if payments.IntentKey("o-1", 1999, "EUR") == payments.IntentKey("o-1", 2000, "EUR") {
		t.Fatal("another amount is another intent")
	}
	if payments.RefundIntentKey("p", 100) == payments.RefundIntentKey("p", 101) ||
		payments.RefundIntentKey("o-1", 1999) == payments.IntentKey("o-1", 1999, "EUR") {
		t.Fatal("refund intents")
	}
	if !bytes.Equal(payments.Fingerprint("POST", "/a", []byte("{}")), payments.Fingerprint("POST", "/a", []byte("{}"))) ||
		bytes.Equal(payments.Fingerprint("POST", "/a", []byte("{}")), payments.Fingerprint("POST", "/b", []byte("{}"))) {
		t.Fatal("fingerprint")
	}
}

func intentReq(client, key string) payments.IdempotencyRequest {
	r := idemReq(client, key, key)
	r.Kind = payments.IdempotencyIntentKey
	return r
}

// An intent's window slides: a request at 12:04:59 and its retry at 12:05:01 are one intent (the
// truncated 5-minute windows of the main before this change split them: a second refund), and so
// is a chain of retries each within 5 minutes of the one before; 5 minutes of silence end it,
// and the next request is a new use of the intent (a new Since).
func TestIntentWindowSlides(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	r := intentReq(cl.ID, payments.RefundIntentKey(uuid.NewString(), 100))
	b.clock.Set(t0.Add(4*time.Minute + 59*time.Second)) // 12:04:59
	first, err := x.Acquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Complete(ctx, r, first.Token, uuid.NewString(), 201); err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Duration{2 * time.Second, 4*time.Minute + 58*time.Second, 4*time.Minute + 59*time.Second} {
		b.clock.Advance(at) // 12:05:01, 12:09:59, 12:14:58: each within 5 minutes of the one before
		s, err := x.Acquire(ctx, r)
		if err != nil || !s.Done || !s.Since.Equal(first.Since) {
			t.Fatalf("retry at %s = %+v %v, want the first use replayed", b.clock.Now().Format("15:04:05"), s, err)
		}
	}
	// Five minutes after the last retry the intent is still alive for IntentGraceFor: a request that
	// read its time inside the window may reach the key that late.
	b.clock.Advance(5 * time.Minute) // 12:19:58
	if s, err := x.Acquire(ctx, r); err != nil || !s.Done || !s.Since.Equal(first.Since) {
		t.Fatalf("at 5 minutes of silence, within the grace = %+v %v, want the first use replayed", s, err)
	}
	b.clock.Advance(5*time.Minute + payments.IntentGraceFor(0)) // quiet again, past the grace
	s, err := x.Acquire(ctx, r)
	if err != nil || s.Done || s.Token == "" || s.Since.Equal(first.Since) {
		t.Fatalf("after 5 minutes of silence and the grace = %+v %v, want a new use of the intent", s, err)
	}
	// A client key does not slide: it lives its TTL from its first use.
	ck := idemReq(cl.ID, "k", `{}`)
	s, err = x.Acquire(ctx, ck)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Complete(ctx, ck, s.Token, uuid.NewString(), 201); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(payments.DefaultIdempotencyTTL - time.Minute)
	if s, err := x.Acquire(ctx, ck); err != nil || !s.Done {
		t.Fatalf("client key before its TTL = %+v %v", s, err)
	}
	b.clock.Advance(time.Minute)
	if s, err := x.Acquire(ctx, ck); err != nil || s.Done {
		t.Fatalf("client key at its TTL = %+v %v, want a new use", s, err)
	}
}

// Run owns the protocol: a completed key replays without running the effect; an effect's failure
// without effect (ECONFLICT, EINVALID, ENOTFOUND, EBUSY) releases the key, so a corrected request
// may use it; an uncertain one (a database error, EUNAVAIL) abandons it, bound to its request,
// which may take it over at once.
func TestIdempotencyRunOwnsTheProtocol(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	ran := 0
	effect := func(id string, status int, err error) payments.Effect {
		return func(context.Context, payments.Slot) (string, int, error) {
			ran++
			return id, status, err
		}
	}
	rid := uuid.NewString()

	// Released: the same key then serves another request.
	first, other := idemReq(cl.ID, "released", `{"amount":1}`), idemReq(cl.ID, "released", `{"amount":2}`)
	if _, err := x.Run(ctx, first, effect("", 0, payments.Errorf(payments.ECONFLICT, "no"))); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("run = %v", err)
	}
	out, err := x.Run(ctx, other, effect(rid, 201, nil))
	if err != nil || out.Replayed || out.ResourceID != rid || out.Status != 201 {
		t.Fatalf("another request after a release = %+v %v", out, err)
	}
	// Completed: replayed, the effect does not run again.
	before := ran
	out, err = x.Run(ctx, other, effect("x", 200, nil))
	if err != nil || !out.Replayed || out.ResourceID != rid || out.Status != 201 || ran != before {
		t.Fatalf("replay = %+v %v (effect ran %d more)", out, err, ran-before)
	}

	// Abandoned: another request is refused (422), the same one runs again at once.
	same, changed := idemReq(cl.ID, "abandoned", `{"amount":1}`), idemReq(cl.ID, "abandoned", `{"amount":3}`)
	if _, err := x.Run(ctx, same, effect("", 0, &payments.Error{Code: payments.EUNAVAIL, Message: "db down"})); payments.ErrorCode(err) != payments.EUNAVAIL {
		t.Fatalf("run = %v", err)
	}
	if _, err := x.Run(ctx, changed, effect(rid, 201, nil)); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("another request after an abandon = %v, want invalid", err)
	}
	if _, err := x.Run(ctx, same, effect("", 0, errors.New("internal"))); payments.ErrorCode(err) != payments.EINTERNAL {
		t.Fatalf("the same request again = %v", err)
	}
	out, err = x.Run(ctx, same, effect(rid, 202, nil))
	if err != nil || out.Replayed || out.Status != 202 {
		t.Fatalf("the same request a third time = %+v %v", out, err)
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE key = 'abandoned' AND completed_at IS NOT NULL`); n != 1 {
		t.Fatalf("completed rows = %d", n)
	}

	// Busy: a client key answers EBUSY; an intent with BusyRunsEffect runs the effect without it.
	held := idemReq(cl.ID, "held", `{}`)
	if _, err := x.Acquire(ctx, held); err != nil {
		t.Fatal(err)
	}
	before = ran
	if _, err := x.Run(ctx, held, effect(rid, 200, nil)); payments.ErrorCode(err) != payments.EBUSY || ran != before {
		t.Fatalf("busy client key = %v (effect ran %d)", err, ran-before)
	}
	intent := intentReq(cl.ID, "create/o/1/EUR")
	if _, err := x.Acquire(ctx, intent); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Run(ctx, intent, effect(rid, 200, nil)); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("busy intent without BusyRunsEffect = %v", err)
	}
	intent.BusyRunsEffect = true
	out, err = x.Run(ctx, intent, effect(rid, 200, nil))
	if err != nil || out.Replayed || out.ResourceID != rid || out.Status != 200 {
		t.Fatalf("busy intent with BusyRunsEffect = %+v %v", out, err)
	}
}

// An intent's use outlives a refusal. Two identical keyless requests arrive together: the first
// holds the intent, the second (busy: BusyRunsEffect) runs its effect under the first one's use
// and makes the resource; the first is then refused (a 409: a Pending refund held the room until
// the patrol settled it Failed). The next identical request, seconds later, must run under the
// same use (Since): a refund's RequestKey is derived from it, and a new use made a second refund
// of the same keyless intent (an outside review). Negative control: releasing an intent on a
// refusal, as a client key is released, gives the third request a new use.
func TestIntentUseOutlivesARefusal(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	r := intentReq(cl.ID, payments.RefundIntentKey(uuid.NewString(), 500))
	r.BusyRunsEffect = true

	var firstUse, busyUse, nextUse time.Time
	made := uuid.NewString()
	_, err := x.Run(ctx, r, func(ctx context.Context, slot payments.Slot) (string, int, error) {
		firstUse = slot.Since
		out, err := x.Run(ctx, r, func(_ context.Context, busy payments.Slot) (string, int, error) {
			busyUse = busy.Since
			return made, 201, nil
		})
		if err != nil || out.ResourceID != made {
			t.Fatalf("the busy duplicate = %+v %v", out, err)
		}
		return "", 0, payments.Errorf(payments.ECONFLICT, "the refunds would exceed the amount received")
	})
	if payments.ErrorCode(err) != payments.ECONFLICT || !busyUse.Equal(firstUse) {
		t.Fatalf("first = %v; the busy duplicate ran under %s, the first under %s", err, busyUse, firstUse)
	}

	b.clock.Advance(10 * time.Second)
	if _, err := x.Run(ctx, r, func(_ context.Context, slot payments.Slot) (string, int, error) {
		nextUse = slot.Since
		return made, 201, nil
	}); err != nil {
		t.Fatal(err)
	}
	if !nextUse.Equal(firstUse) {
		t.Fatalf("the request 10 s later ran under a new use (%s, the first %s): its refund would be a second one", nextUse, firstUse)
	}
}
