package payments_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A new code replaces the earlier ones: the first challenge, even with its right code, answers
// EEXPIRED (410) once a second code was sent; the second one cancels. On the main before this
// change both stayed valid, so asking twice doubled what could be guessed.
func TestNewCodeSupersedesEarlierOnes(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-supersede", 1000)
	first, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	firstCode := b.lastCode(t, sess.ID)
	b.clock.Advance(time.Minute)
	second, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	secondCode := b.lastCode(t, sess.ID)
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, first.ID, firstCode); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("the superseded code = %v, want expired", err)
	}
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, second.ID, secondCode)
	if err != nil || res.Session.Status != payments.StatusCanceled {
		t.Fatalf("the latest code = %+v %v", res, err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("reverses = %d", n)
	}
}

// At most three code requests per payment per hour: the fourth is ELOCKED with a Retry-After
// that says when the oldest of the three leaves the hour; then one more may be sent. On the main
// before this change every request made a code (twenty requests, twenty messages).
func TestCodeRequestsPerPaymentPerHour(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-requests", 1000)
	for i := range payments.CodeRequestsPerHour {
		if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		b.clock.Advance(10 * time.Minute)
	}
	// 30 minutes after the first request.
	_, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("fourth request = %v, want locked", err)
	}
	if ra := payments.RetryAfter(err); ra != 30*time.Minute {
		t.Fatalf("Retry-After = %s, want 30m (when the first request leaves the hour)", ra)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, sess.ID); n != payments.CodeRequestsPerHour {
		t.Fatalf("messages = %d, want %d", n, payments.CodeRequestsPerHour)
	}
	b.clock.Advance(30 * time.Minute)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatalf("after the hour: %v", err)
	}
	// Another payment has its own budget.
	other := b.registered(t, "o-requests-2", 1000)
	if _, err := b.svc.RequestCancel(ctx, api, other.ID); err != nil {
		t.Fatalf("another payment: %v", err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID)); err != nil {
		t.Fatalf("the latest code: %v", err)
	}
}

// At most ten wrong guesses per payment per 24 hours, across all its codes: three codes with up
// to five attempts each no longer give fifteen guesses. After the tenth wrong one even the right
// code is refused (ELOCKED with a Retry-After of when the first guess is a day old), and no new
// code is sent; a day later the payment may try again. Fails on the main before this change,
// where the right code still cancelled after ten wrong ones.
func TestWrongGuessesPerPaymentAcrossCodes(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-guesses", 1000)
	guess := func(n int) (payments.Challenge, string) {
		t.Helper()
		ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		code := b.lastCode(t, sess.ID)
		for range n {
			if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, otherCode(code)); payments.ErrorCode(err) != payments.EWRONG {
				t.Fatalf("wrong guess = %v", err)
			}
			b.clock.Advance(time.Minute)
		}
		return ch, code
	}
	guess(4)
	guess(4)
	ch, code := guess(2) // the tenth wrong guess
	_, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code)
	if payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("the right code after ten wrong ones = %v, want locked", err)
	}
	if ra := payments.RetryAfter(err); ra != 24*time.Hour-10*time.Minute {
		t.Fatalf("Retry-After = %s, want 23h50m (the first wrong guess is a day old then)", ra)
	}
	b.clock.Advance(time.Hour)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("a new code while the budget is spent = %v, want locked", err)
	}
	if n := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1`, sess.ID); n != payments.CodeGuessesPerDay {
		t.Fatalf("wrong guesses recorded = %d", n)
	}
	if b.gw.Calls(fakegw.OpReverse) != 0 {
		t.Fatal("a locked payment reached the gateway")
	}
	b.clock.Advance(23 * time.Hour)
	ch, err = b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatalf("a day later: %v", err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID)); err != nil {
		t.Fatalf("a day later, the right code: %v", err)
	}
}

// The budget's last unit, wanted by two replicas at once. Nine wrong guesses are spent; two
// wrong guesses arrive through two pools. The first is parked holding the order → session locks
// (AfterCancelLock); the second is seen waiting for them in pg_locks; then the first records the
// tenth guess and the second, counting after it, is refused. Exactly ten rows, whatever the
// interleaving: the count and the insert happen under the lock.
func TestWrongGuessBudgetHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	p := newParker()
	parked := false
	b := newBench(t)
	hooked := func(c *payments.Config) {
		c.CodeAttempts = 50
		c.Hooks.AfterCancelLock = func(ctx context.Context, id string) {
			if parked {
				p.hook(ctx, id)
			}
		}
	}
	r1 := b.service(testdb.Pool(t, b.url), "replica-1", hooked)
	r2 := b.service(testdb.Pool(t, b.url), "replica-2", hooked)
	ctx := context.Background()
	sess := b.registered(t, "o-race-guess", 1000)
	ch, err := r1.RequestCancel(ctx, api, sess.ID) // one code with attempts to spare: only the payment's budget binds
	if err != nil {
		t.Fatal(err)
	}
	wrong := otherCode(b.lastCode(t, sess.ID))
	for range payments.CodeGuessesPerDay - 1 {
		if _, err := r1.ConfirmCancel(ctx, api, sess.ID, ch.ID, wrong); payments.ErrorCode(err) != payments.EWRONG {
			t.Fatal(err)
		}
	}
	parked = true
	c1 := goConfirm(r1, sess.ID, ch.ID, wrong)
	mustWait(t, p.arrived, "the first guess holds the locks")
	c2 := goConfirm(r2, sess.ID, ch.ID, wrong)
	waitLockWaiters(t, b.pool, 1)
	p.let(1)
	mustWait(t, p.arrived, "the second guess gets the locks")
	p.let(1)
	o1, o2 := mustWait(t, c1, "guess 1"), mustWait(t, c2, "guess 2")
	if payments.ErrorCode(o1.err) != payments.EWRONG || payments.ErrorCode(o2.err) != payments.ELOCKED {
		t.Fatalf("outcomes = %v / %v, want wrong then locked", o1.err, o2.err)
	}
	if n := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1`, sess.ID); n != payments.CodeGuessesPerDay {
		t.Fatalf("wrong guesses = %d, want exactly %d", n, payments.CodeGuessesPerDay)
	}
}

// naiveWrongGuess is a budget counted outside the serialising lock: count, then record. The
// negative control of the test above.
func naiveWrongGuess(ctx context.Context, pool *pgxpool.Pool, sessionID, challengeID string, now time.Time, afterCount func(context.Context, string)) (bool, error) {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1 AND created_at > $2`,
		sessionID, now.Add(-24*time.Hour)).Scan(&n); err != nil {
		return false, err
	}
	afterCount(ctx, sessionID)
	if n >= payments.CodeGuessesPerDay {
		return false, nil
	}
	_, err := pool.Exec(ctx, `INSERT INTO code_wrong_guesses (session_id, challenge_id, created_at) VALUES ($1, $2, $3)`, sessionID, challengeID, now)
	return err == nil, err
}

// The negative control: the same two last guesses, both counted before either records, spend
// eleven units of a budget of ten.
func TestWrongGuessBudgetNaiveCountOverspends(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-naive-guess", 1000)
	ch, err := b.plain.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	for range payments.CodeGuessesPerDay - 1 {
		if _, err := b.pool.Exec(ctx, `INSERT INTO code_wrong_guesses (session_id, challenge_id, created_at) VALUES ($1, $2, $3)`, sess.ID, ch.ID, t0); err != nil {
			t.Fatal(err)
		}
	}
	p := newParker()
	type out struct {
		ok  bool
		err error
	}
	res := make(chan out, 2)
	for _, pool := range []*pgxpool.Pool{b.pool, testdb.Pool(t, b.url)} {
		go func() {
			ok, err := naiveWrongGuess(ctx, pool, sess.ID, ch.ID, t0, p.hook)
			res <- out{ok, err}
		}()
	}
	mustWait(t, p.arrived, "count 1")
	mustWait(t, p.arrived, "count 2")
	p.let(2)
	for range 2 {
		if o := mustWait(t, res, "naive guess"); o.err != nil || !o.ok {
			t.Fatalf("naive guess = %+v", o)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1`, sess.ID); n != payments.CodeGuessesPerDay+1 {
		t.Fatalf("naive count recorded %d guesses; the control expected %d (budget overspent)", n, payments.CodeGuessesPerDay+1)
	}
}

// Once delivered, the outbox keeps the message without its code (the admin outbox page shows
// that); the notifier got the code. Undelivered (no sink configured), the outbox is the sink and
// keeps it. Fails on the main before this change, where the code stayed in outbox.body.
func TestDeliveredCodeIsRedactedInTheOutbox(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	sess := b.registered(t, "o-redact", 1000)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID) // the first delivery failed: still in the outbox for the retry
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	b.clock.Advance(2 * time.Minute)
	if sent, err := b.svc.DeliverOutbox(ctx); sent != 1 || err != nil {
		t.Fatalf("retry = %d %v", sent, err)
	}
	n.mu.Lock()
	got := n.got[0].Text
	n.mu.Unlock()
	if !strings.Contains(got, code) {
		t.Fatalf("the customer's message %q lacks the code", got)
	}
	var body string
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1`, sess.ID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(body, code) || !strings.Contains(body, "••••••") {
		t.Fatalf("outbox body after delivery = %q, want the code redacted", body)
	}
	// Delivered at once by RequestCancel itself: redacted as well.
	b.clock.Advance(time.Minute)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND body ~ '\d{6}'`, sess.ID); n != 0 {
		t.Fatalf("%d delivered messages still hold a code", n)
	}
}

// CODE_REQUESTS_PER_CONTACT_PER_HOUR: each payment has its own 3 codes an hour (the contract's),
// so many payments naming one contact — a shop's API key in the wrong hands creating orders for
// a victim's number, a careless support user — made pitlane text one phone without end (an
// outside review, notifier abuse: 15 codes in an hour through 5 payments). With the bound set,
// the codes to one contact (in any case) within the hour count across its payments: the next
// is refused (ELOCKED, Retry-After when the oldest leaves the hour) and nothing is sent; another
// contact is not touched. The count waits for the contact's lock, so two payments of one
// contact cannot both take the last code: a request is seen blocked by a holder of that lock
// (pg_blocking_pids). Negative controls: without contactCodesAllowed the sixth code is sent;
// without its lock nothing waits.
func TestCodeRequestsPerContactPerHour(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.CodeRequestsPerContact = 4 })
	ctx := context.Background()
	pay := func(order, contact string) payments.Session {
		t.Helper()
		r, err := b.plain.Create(ctx, api, payments.CreateInput{OrderID: order, Amount: 1000, Currency: "EUR", CustomerContact: contact})
		if err != nil || r.Session.Status != payments.StatusRegistered {
			t.Fatalf("setup: %+v %v", r.Session, err)
		}
		return r.Session
	}
	// One recipient however the shop wrote it: case, surrounding spaces.
	first, second, third := pay("o-contact-1", "Victim@Example.com"), pay("o-contact-2", " victim@example.com"), pay("o-contact-3", "victim@example.com ")
	other := pay("o-contact-other", "someone@example.com")
	for range payments.CodeRequestsPerHour {
		if _, err := b.svc.RequestCancel(ctx, api, first.ID); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.Advance(20 * time.Minute)
	if _, err := b.svc.RequestCancel(ctx, api, second.ID); err != nil {
		t.Fatalf("the contact's fourth code: %v", err)
	}
	for _, s := range []payments.Session{second, third} {
		_, err := b.svc.RequestCancel(ctx, api, s.ID)
		if payments.ErrorCode(err) != payments.ELOCKED || payments.RetryAfter(err) != 40*time.Minute {
			t.Fatalf("the contact's fifth code (payment %s) = %v (Retry-After %s), want locked for 40m", s.OrderID, err, payments.RetryAfter(err))
		}
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE lower(btrim(to_addr)) = 'victim@example.com'`); n != 4 {
		t.Fatalf("codes to the contact = %d, want 4", n)
	}
	if _, err := b.svc.RequestCancel(ctx, api, other.ID); err != nil {
		t.Fatalf("another contact: %v", err)
	}
	// A phone number by its digits, however it is written: "+1 (555) 123-4567", with a no-break
	// or a thin space (the API takes them), with a tel: prefix — one phone (a review of the
	// first key, which kept what the database's ctype did not call a space).
	spellings := []string{"+1 (555) 123-4567", "+1\u00a0555\u00a0123\u00a04567", "+1\u2009555/123/4567", "tel:+15551234567", "+15551234567"}
	sent := 0
	for i, phone := range spellings {
		s := pay(fmt.Sprintf("o-contact-phone-%d", i), phone)
		_, err := b.svc.RequestCancel(ctx, api, s.ID)
		if sent < 4 && err != nil {
			t.Fatalf("the phone's code %d (%q): %v", sent+1, phone, err)
		}
		if sent >= 4 && payments.ErrorCode(err) != payments.ELOCKED {
			t.Fatalf("the phone's fifth code, written %q = %v, want locked", phone, err)
		}
		sent++
	}
	// A contact that names nobody ("-") is not one shared budget of every such payment.
	for i := range 5 {
		if _, err := b.svc.RequestCancel(ctx, api, pay(fmt.Sprintf("o-contact-dash-%d", i), "-").ID); err != nil {
			t.Fatalf("code %d to a contact of a dash: %v", i+1, err)
		}
	}

	// An hour after the first codes: one more, and it waits for the contact's lock.
	b.clock.Advance(40 * time.Minute)
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	var pid int32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid() FROM (SELECT pg_advisory_xact_lock($1, hashtext(pitlane_contact_key($2)))) AS l`,
		int32(payments.LockCodeContact), "VICTIM@example.com").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ch  payments.Challenge
		err error
	}
	done := make(chan result, 1)
	go func() { ch, err := b.svc.RequestCancel(ctx, api, third.ID); done <- result{ch, err} }()
	waitBlockedBy(t, b.pool, pid)
	// The wait is not taken off the code's life: it runs from its issue, after the lock (a
	// review: read before the wait, the code lived 4 s less).
	b.clock.Advance(4 * time.Second)
	issued := b.clock.Now()
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := mustWait(t, done, "the code request after the lock")
	if r.err != nil {
		t.Fatalf("a code an hour later: %v", r.err)
	}
	if !r.ch.ExpiresAt.Equal(issued.Add(10 * time.Minute)) {
		t.Fatalf("the code issued at %s after waiting for the contact's lock expires at %s, want its whole 10 minutes", issued, r.ch.ExpiresAt)
	}
}
