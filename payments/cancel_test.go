package payments_test

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/internal/testdb"
	"pitlane/internal/testlog"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

var codeRe = regexp.MustCompile(`is (\d{6})\.`)

// lastCode reads the code the customer received (the outbox is the notification sink).
func (b *bench) lastCode(t *testing.T, sessionID string) string {
	t.Helper()
	var body string
	if err := b.pool.QueryRow(context.Background(), `SELECT body FROM outbox WHERE payment_id = $1 AND kind IN ('cancel_code', 'refund_code') ORDER BY id DESC LIMIT 1`, sessionID).Scan(&body); err != nil {
		t.Fatalf("no code in the outbox: %v", err)
	}
	m := codeRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no code in %q", body)
	}
	return m[1]
}

func otherCode(code string) string {
	if code == "000000" {
		return "000001"
	}
	return "000000"
}

func TestCancelHappyPathAndReplay(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-cancel", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !ch.ExpiresAt.Equal(t0.Add(10 * time.Minute)) {
		t.Fatalf("expires at %v", ch.ExpiresAt)
	}
	code := b.lastCode(t, sess.ID)
	// The code is stored only as a keyed hash.
	if n := b.count(t, `SELECT count(*) FROM cancel_challenges WHERE position($1::bytea in code_hash) > 0 OR encode(code_hash, 'escape') LIKE '%'||$2||'%'`, []byte(code), code); n != 0 {
		t.Fatal("the code is stored in clear")
	}
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code)
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed || res.Session.Status != payments.StatusCanceled {
		t.Fatalf("confirm = %+v", res)
	}
	again, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code)
	if err != nil || !again.Replayed || again.Session.Status != payments.StatusCanceled {
		t.Fatalf("same code again = %+v %v", again, err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("gateway reverses = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM reverse_operations WHERE session_id = $1`, sess.ID); n != 1 {
		t.Fatalf("reverse operations = %d", n)
	}
	// A canceled payment cannot be canceled again.
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("request cancel of Canceled = %v", err)
	}
	// The reverse used the operation's id as the idempotency key.
	var opID string
	if err := b.pool.QueryRow(ctx, `SELECT id::text FROM reverse_operations WHERE session_id = $1`, sess.ID).Scan(&opID); err != nil {
		t.Fatal(err)
	}
	if b.gw.KeyCalls(fakegw.OpReverse, opID) != 1 {
		t.Fatal("reverse not sent with the operation id as key")
	}
}

type confirmOut struct {
	r   payments.ConfirmResult
	err error
}

func goConfirm(svc *payments.Service, id, ch, code string) <-chan confirmOut {
	out := make(chan confirmOut, 1)
	go func() {
		r, err := svc.ConfirmCancel(context.Background(), api, id, ch, code)
		out <- confirmOut{r, err}
	}()
	return out
}

// The same code confirmed twice at once from two replicas: the first holds the locks while the
// second is seen waiting; one reverse operation, one gateway reverse, the second is a replay.
func TestCancelSameCodeTwoReplicas(t *testing.T) {
	t.Parallel()
	p := newParker()
	b := newBench(t, func(c *payments.Config) { c.Hooks.AfterCancelLock = p.hook })
	other := b.service(testdb.Pool(t, b.url), "replica-b", func(c *payments.Config) { c.Hooks.AfterCancelLock = p.hook })
	sess := b.registered(t, "o-2x", 1000)
	ch, err := b.plain.RequestCancel(context.Background(), api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	c1 := goConfirm(b.svc, sess.ID, ch.ID, code)
	mustWait(t, p.arrived, "first confirm holds the locks")
	c2 := goConfirm(other, sess.ID, ch.ID, code)
	waitLockWaiters(t, b.pool, 1)
	p.let(1)
	mustWait(t, p.arrived, "second confirm gets the locks")
	p.let(1)
	r1, r2 := mustWait(t, c1, "confirm 1"), mustWait(t, c2, "confirm 2")
	if r1.err != nil || r2.err != nil {
		t.Fatalf("errors: %v %v", r1.err, r2.err)
	}
	if r1.r.Replayed || !r2.r.Replayed {
		t.Fatalf("replayed flags %v %v", r1.r.Replayed, r2.r.Replayed)
	}
	if n := b.count(t, `SELECT count(*) FROM reverse_operations`); n != 1 {
		t.Fatalf("reverse operations = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("gateway reverses = %d", n)
	}
}

// Ten wrong codes at once: the counter is exact and the challenge locks at five.
func TestCancelWrongCodesLockAtFive(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-wrong", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	wrong := otherCode(code)
	pool2 := testdb.Pool(t, b.url)
	svc2 := b.service(pool2, "replica-b")
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	start := make(chan struct{})
	for i := range 10 {
		svc := b.svc
		if i%2 == 1 {
			svc = svc2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, wrong)
			mu.Lock()
			codes[payments.ErrorCode(err)]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if codes[payments.EWRONG] != 5 || codes[payments.ELOCKED] != 5 {
		t.Fatalf("outcomes = %v, want 5 wrong and 5 locked", codes)
	}
	if n := b.count(t, `SELECT attempts FROM cancel_challenges WHERE id = $1`, ch.ID); n != 5 {
		t.Fatalf("attempts = %d, want 5", n)
	}
	// Even the right code is refused now.
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code); payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("right code after lock = %v", err)
	}
	if b.gw.Calls(fakegw.OpReverse) != 0 {
		t.Fatal("a locked challenge reached the gateway")
	}
}

func TestCancelCodeExpires(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-exp", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	b.clock.Advance(10*time.Minute + time.Second)
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("expired code = %v", err)
	}
	// A fresh challenge works; the old one stays dead.
	ch2, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch2.ID, b.lastCode(t, sess.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("old challenge after cancel = %v", err)
	}
}

// A code spent while its request waited for the payment's locks is judged when the locks are
// held, not when the wait began: a confirmation queued behind another transaction across the
// code's expiry is refused as expired (cancel and refund alike). The clock was read before the
// wait, and a code was accepted up to one lock_timeout past its expiry (staff review, session
// 29). Negative control: reading the clock before inTx again (as it was) accepts both codes.
func TestACodeIsJudgedWhenItsLocksAreHeld(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-code-wait", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	release := holdOrderRow(t, b, sess.OrderID)
	b.clock.Advance(10*time.Minute - time.Second) // a second before the code's expiry
	confirmed := goConfirm(b.svc, sess.ID, ch.ID, b.lastCode(t, sess.ID))
	waitLockWaiters(t, b.pool, 1)
	b.clock.Advance(2 * time.Second) // expired while it waits
	release()
	if out := mustWait(t, confirmed, "the cancel's confirmation"); payments.ErrorCode(out.err) != payments.EEXPIRED {
		t.Fatalf("a code that expired while waiting for the locks = %+v %v, want expired", out.r, out.err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 0 {
		t.Fatalf("reverses = %d, want none", n)
	}

	paid := b.completed(t, "o-code-wait-refund", 1000)
	rc, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 400, uuid.NewString()))
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, paid.ID)
	release = holdOrderRow(t, b, paid.OrderID)
	b.clock.Advance(10*time.Minute - time.Second)
	refunded := make(chan error, 1)
	go func() {
		_, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, rc.ID, code)
		refunded <- err
	}()
	waitLockWaiters(t, b.pool, 1)
	b.clock.Advance(2 * time.Second)
	release()
	if err := mustWait(t, refunded, "the refund's confirmation"); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("a refund code that expired while waiting for the locks = %v, want expired", err)
	}
	if n := b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1`, paid.ID); n != 0 {
		t.Fatalf("refunds = %d, want none", n)
	}
}

// Check and Cancel on one session, interleaved both ways: no deadlock, one consistent outcome.
func TestCheckAndCancelInterleaved(t *testing.T) {
	t.Parallel()
	t.Run("check first: the payment succeeded", func(t *testing.T) {
		t.Parallel()
		checkLocked := newParker()
		b := newBench(t, func(c *payments.Config) { c.Hooks.AfterApplyLock = checkLocked.hook })
		canceler := b.service(testdb.Pool(t, b.url), "replica-b")
		sess := b.registered(t, "o-cc1", 100)
		ch, err := b.plain.RequestCancel(context.Background(), api, sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		code := b.lastCode(t, sess.ID)
		b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
		chk := goCheck(b.svc, sess.ID)
		mustWait(t, checkLocked.arrived, "check holds the locks")
		cnl := goConfirm(canceler, sess.ID, ch.ID, code)
		waitLockWaiters(t, b.pool, 1)
		checkLocked.let(1)
		rc, rx := mustWait(t, chk, "check"), mustWait(t, cnl, "cancel")
		if rc.err != nil || rc.s.Status != payments.StatusCompleted {
			t.Fatalf("check = %s %v", rc.s.Status, rc.err)
		}
		if payments.ErrorCode(rx.err) != payments.ECONFLICT {
			t.Fatalf("cancel after completion = %+v %v, want conflict", rx.r, rx.err)
		}
		if b.gw.Calls(fakegw.OpReverse) != 0 || b.count(t, `SELECT count(*) FROM reverse_operations`) != 0 {
			t.Fatal("a completed payment was reversed")
		}
		if b.count(t, `SELECT count(*) FROM accounting_entries`) != 1 {
			t.Fatal("want one ledger entry")
		}
	})
	t.Run("cancel first: the reverse wins", func(t *testing.T) {
		t.Parallel()
		cancelLocked := newParker()
		b := newBench(t, func(c *payments.Config) { c.Hooks.AfterCancelLock = cancelLocked.hook })
		checker := b.service(testdb.Pool(t, b.url), "replica-b")
		sess := b.registered(t, "o-cc2", 100)
		ch, err := b.plain.RequestCancel(context.Background(), api, sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		code := b.lastCode(t, sess.ID)
		b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewayAuthorized)
		cnl := goConfirm(b.svc, sess.ID, ch.ID, code)
		mustWait(t, cancelLocked.arrived, "cancel holds the locks")
		chk := goCheck(checker, sess.ID)
		waitLockWaiters(t, b.pool, 1)
		cancelLocked.let(1)
		rx, rc := mustWait(t, cnl, "cancel"), mustWait(t, chk, "check")
		if rx.err != nil || rc.err != nil {
			t.Fatalf("errors: %v %v", rx.err, rc.err)
		}
		final, err := b.svc.Get(context.Background(), sess.ID)
		if err != nil || final.Status != payments.StatusCanceled {
			t.Fatalf("final = %s %v", final.Status, err)
		}
		if b.gw.Calls(fakegw.OpReverse) != 1 || b.count(t, `SELECT count(*) FROM accounting_entries`) != 0 {
			t.Fatal("want one reverse and no ledger entry")
		}
	})
}

// The payment succeeds at the gateway after the code was consumed but before the reverse: the
// gateway refuses the reverse, the session becomes Completed (money received once) and finance
// gets a case.
func TestCancelLosesRaceToPayment(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-race", 100)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	code := b.lastCode(t, sess.ID)
	// Nothing was canceled: the answer is the refusal of a payment that cannot be canceled (the
	// API's 409), not an accepted cancel (202) carrying a Completed payment.
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code)
	if payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(err.Error(), "captured before the cancel") {
		t.Fatalf("confirm = %+v %v, want a conflict naming the capture", res, err)
	}
	if res.Session.Status != payments.StatusCompleted {
		t.Fatalf("status = %s, want Completed", res.Session.Status)
	}
	if b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-race'`) != 1 {
		t.Fatal("want one ledger entry")
	}
	if b.count(t, `SELECT count(*) FROM finance_cases WHERE kind = 'cancel_lost_race'`) != 1 {
		t.Fatal("want a cancel_lost_race case")
	}
	// The same code again answers the same, and reverses nothing more.
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("same code again = %v, want conflict", err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("gateway reverses = %d, want 1", n)
	}
}

// A challenge id is a UUID: in upper case it names the same challenge, and its right code
// confirms (and replays) instead of counting as a wrong guess.
func TestCancelChallengeIDInUpperCase(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-upper", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	upper := strings.ToUpper(ch.ID)
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, upper, code)
	if err != nil || res.Replayed || res.Session.Status != payments.StatusCanceled {
		t.Fatalf("confirm with the id in upper case = %+v %v", res, err)
	}
	again, err := b.svc.ConfirmCancel(ctx, api, sess.ID, upper, code)
	if err != nil || !again.Replayed {
		t.Fatalf("same code again = %+v %v", again, err)
	}
	if n := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1`, sess.ID); n != 0 {
		t.Fatalf("wrong guesses = %d, want 0", n)
	}
}

// Once a payment cannot be canceled any more, a code is refused as that (conflict) whatever it
// is, and a code never used spends no guess of the payment's budget; the code that canceled it
// replays, and a wrong guess at that used code counts (TestAUsedCodeIsGuessedWithinThePaymentsBudget:
// the replay tells the right code apart, so the budget holds for it).
func TestCancelCodeOnAFinishedPayment(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	canceled := b.registered(t, "o-done-canceled", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, canceled.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, canceled.ID)
	if _, err := b.svc.ConfirmCancel(ctx, api, canceled.ID, ch.ID, code); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, canceled.ID, ch.ID, otherCode(code)); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("wrong code on a Canceled payment = %v, want conflict", err)
	}
	if again, err := b.svc.ConfirmCancel(ctx, api, canceled.ID, ch.ID, code); err != nil || !again.Replayed {
		t.Fatalf("the code that canceled it = %+v %v, want a replay", again, err)
	}

	paid := b.registered(t, "o-done-paid", 1000)
	ch2, err := b.svc.RequestCancel(ctx, api, paid.ID)
	if err != nil {
		t.Fatal(err)
	}
	code2 := b.lastCode(t, paid.ID)
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(ctx, api, paid.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{otherCode(code2), code2} {
		if _, err := b.svc.ConfirmCancel(ctx, api, paid.ID, ch2.ID, c); payments.ErrorCode(err) != payments.ECONFLICT {
			t.Fatalf("code %s on a Completed payment = %v, want conflict", c, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1`, paid.ID); n != 0 {
		t.Fatalf("wrong guesses on the Completed payment = %d, want 0", n)
	}
	if n := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1`, canceled.ID); n != 1 {
		t.Fatalf("wrong guesses at the Canceled payment's used code = %d, want 1", n)
	}
	if n := b.count(t, `SELECT attempts FROM cancel_challenges WHERE id = $1`, ch2.ID); n != 0 {
		t.Fatalf("attempts on the Completed payment's code = %d, want 0", n)
	}
}

// cancelWithLostReverse requests and confirms the cancel of sess while the gateway's answer to
// the reverse is lost: the session stays Canceling with its reverse operation Pending.
func (b *bench) cancelWithLostReverse(t *testing.T, sess payments.Session) {
	t.Helper()
	ctx := context.Background()
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.Fail(fakegw.OpReverse, fakegw.Transient, 1)
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID))
	if err != nil || res.Session.Status != payments.StatusCanceling {
		t.Fatalf("after lost reverse = %s %v", res.Session.Status, err)
	}
}

// No answer to the reverse: the session stays Canceling, and the sweeper repeats the reverse with
// the same key until the gateway confirms.
func TestCancelReverseLostThenSwept(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-lost-rev", 100)
	b.cancelWithLostReverse(t, sess)
	b.clock.Advance(time.Minute)
	if n, err := b.svc.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("sweep = %d %v", n, err)
	}
	final, _ := b.svc.Get(ctx, sess.ID)
	if final.Status != payments.StatusCanceled {
		t.Fatalf("after sweep = %s", final.Status)
	}
	var opID string
	_ = b.pool.QueryRow(ctx, `SELECT id::text FROM reverse_operations WHERE session_id = $1`, sess.ID).Scan(&opID)
	if b.gw.KeyCalls(fakegw.OpReverse, opID) != 2 || b.gw.Calls(fakegw.OpReverse) != 2 {
		t.Fatal("the sweeper must repeat the reverse with the same key")
	}
}

// A cancel asked again while the first one is under way (Canceling, its reverse's answer lost)
// is refused as a conflict: it sends the customer no code and spends none of the payment's code
// requests (audit 7: it sent a fresh code for a cancel already confirmed).
func TestCancelRequestWhileCancelingSendsNoCode(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-cancel-again", 100)
	b.cancelWithLostReverse(t, sess)
	outbox := b.count(t, `SELECT count(*) FROM outbox`)
	codes := b.count(t, `SELECT count(*) FROM cancel_challenges WHERE session_id = $1`, sess.ID)
	_, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(payments.ErrorMessage(err), "already under way") {
		t.Fatalf("cancel asked again while Canceling: %v, want a conflict saying the cancel is under way", err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox`); n != outbox {
		t.Fatalf("messages to the customer: %d, want %d (no new code)", n, outbox)
	}
	if n := b.count(t, `SELECT count(*) FROM cancel_challenges WHERE session_id = $1`, sess.ID); n != codes {
		t.Fatalf("challenges: %d, want %d", n, codes)
	}
	// The patrol still finishes the cancel that is under way.
	b.clock.Advance(time.Minute)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if final, _ := b.svc.Get(ctx, sess.ID); final.Status != payments.StatusCanceled {
		t.Fatalf("after sweep = %s", final.Status)
	}
}

// A cancel whose reverse was lost, and whose payment the gateway then reports captured (a check
// or a webhook, before the patrol repeats the reverse): the session ends Completed with its
// case, and its reverse operation is refused in the same transaction, not left Pending forever
// (the payment page would show a reverse still under way, and nothing would ever finish it).
func TestCancelOvertakenByCaptureRefusesItsReverse(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-overtaken", 100)
	b.cancelWithLostReverse(t, sess)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	got, err := b.svc.Check(ctx, api, sess.ID)
	if err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("check = %s %v, want Completed", got.Status, err)
	}
	var status, detail string
	if err := b.pool.QueryRow(ctx, `SELECT status, detail FROM reverse_operations WHERE session_id = $1`, sess.ID).Scan(&status, &detail); err != nil {
		t.Fatal(err)
	}
	if status != "Refused" || !strings.Contains(detail, "captured") {
		t.Fatalf("reverse operation = %s %q, want Refused naming the capture", status, detail)
	}
	if b.count(t, `SELECT count(*) FROM finance_cases WHERE kind = 'cancel_lost_race' AND session_id = $1`, sess.ID) != 1 {
		t.Fatal("want a cancel_lost_race case")
	}
	// The patrol has nothing left to do for it: no second reverse.
	b.clock.Advance(time.Hour)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("gateway reverses = %d, want 1", n)
	}
}

// Codes never appear in logs.
func TestCancelCodeNeverLogged(t *testing.T) {
	t.Parallel()
	var buf testlog.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b := newBench(t, func(c *payments.Config) {
		c.Logger = logger
		c.Notifier = failingNotifier{}
	})
	ctx := context.Background()
	sess := b.registered(t, "o-log", 100)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	_, _ = b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, otherCode(code))
	b.gw.Fail(fakegw.OpReverse, fakegw.Transient, 1)
	_, _ = b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code)
	if buf.Len() == 0 {
		t.Fatal("expected some log lines (failed notification, lost reverse)")
	}
	if strings.Contains(buf.String(), code) {
		t.Fatalf("the code appears in the logs:\n%s", buf.String())
	}
}

type failingNotifier struct{}

func (failingNotifier) Notify(context.Context, payments.Message) error {
	return context.DeadlineExceeded
}

// flakyNotifier fails while down and records what it delivered.
type flakyNotifier struct {
	mu   sync.Mutex
	down bool
	got  []payments.Message
}

func (n *flakyNotifier) Notify(_ context.Context, m payments.Message) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return context.DeadlineExceeded
	}
	n.got = append(n.got, m)
	return nil
}

// A code whose delivery failed is retried by the patrol (once per replica claim), not lost; an
// expired one is not sent at all.
func TestOutboxRetriesFailedDelivery(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	sess := b.registered(t, "o-outbox", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	if sent, _ := b.svc.DeliverOutbox(ctx); sent != 0 {
		t.Fatal("retried before the backoff")
	}
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	b.clock.Advance(2 * time.Minute)
	other := b.service(testdb.Pool(t, b.url), "replica-b", func(c *payments.Config) { c.Notifier = n })
	var wg sync.WaitGroup
	for _, svc := range []*payments.Service{b.svc, other} {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = svc.DeliverOutbox(ctx) }()
	}
	wg.Wait()
	n.mu.Lock()
	got := len(n.got)
	n.mu.Unlock()
	if got != 1 || b.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`) != 1 {
		t.Fatalf("delivered %d times", got)
	}
	// An undelivered code past its TTL stays in the outbox unsent.
	n.mu.Lock()
	n.down = true
	n.mu.Unlock()
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	b.clock.Advance(11 * time.Minute)
	if sent, _ := b.svc.DeliverOutbox(ctx); sent != 0 {
		t.Fatal("sent an expired code")
	}
}

// A cancel confirmed while the payment's registration is still on its way to the gateway: the
// search by reference would find nothing yet, and that is not the gateway's word. Before, the
// empty search closed the session as Canceled ("nothing to reverse") and the payment appeared at
// the gateway afterwards, pending and never reversed (an outside fault audit); then the cancel
// registered again under the session's key beside the registration on its way, and a gateway
// that ignores keys made a second payment (an outside review, sweeper). Now the cancel is
// Canceling at once and the patrol, once the registration can no longer be on its way
// (cancelGrace), finds the one payment it made and reverses it.
func TestCancelWhileTheRegistrationIsInFlightReversesWhatAppears(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	gate := b.gw.Hold(fakegw.OpRegister)
	defer gate.Open()
	created := make(chan error, 1)
	go func() {
		_, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-cancel-in-flight", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
		created <- err
	}()
	id := mustWait(t, gate.Arrived(), "the registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister) // a registration beside it would go straight through
	ch, err := b.svc.RequestCancel(ctx, api, id)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := b.svc.ConfirmCancel(ctx, api, id, ch.ID, b.lastCode(t, id)); err != nil || r.Session.Status != payments.StatusCanceling {
		t.Fatalf("confirm = %s %v, want Canceling", r.Session.Status, err)
	}
	gate.Open()
	if err := mustWait(t, created, "the Create"); err != nil && payments.ErrorCode(err) != payments.ECONFLICT {
		t.Logf("the Create: %v", err) // it may find its session canceled under it
	}
	if n := b.gw.KeyCalls(fakegw.OpRegister, id); n != 1 {
		t.Fatalf("%d registrations, want Create's alone", n)
	}
	b.clock.Advance(time.Hour)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := b.svc.Get(ctx, id)
	if err != nil || s.Status != payments.StatusCanceled || s.GatewayPaymentID == "" {
		t.Fatalf("session = %+v %v, want Canceled with its gateway payment", s, err)
	}
	if gp, ok := b.gw.Payment(s.GatewayPaymentID); !ok || gp.Status != payments.GatewayReversed {
		t.Fatalf("the gateway's payment = %+v %v, want reversed", gp, ok)
	}
	if n := b.gw.Payments(); n != 1 {
		t.Fatalf("gateway payments = %d, want 1", n)
	}
}

// A reverse the gateway refuses while the payment is still held (authorized: a 400, a proxy's
// 404, anything but not_reversible) does not end the customer's confirmed cancel: the operation
// stays Pending and the patrol sends it again with the same key. Before, it was marked Refused
// at once, the patrol then only Checked the session, a new cancel was refused (Canceling), and
// the held money was captured later as a "lost race" (an outside review).
func TestCancelReverseRefusedWhileHeldIsSentAgain(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-rev-refused", 1000)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewayAuthorized)
	if got, err := b.svc.Check(ctx, api, sess.ID); err != nil || got.Status != payments.StatusAuthorized {
		t.Fatalf("check = %s %v", got.Status, err)
	}
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.Fail(fakegw.OpReverse, fakegw.Definitive, 1)
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID))
	if err != nil || res.Session.Status != payments.StatusCanceling {
		t.Fatalf("confirm = %s %v, want Canceling", res.Session.Status, err)
	}
	if n := b.count(t, `SELECT count(*) FROM reverse_operations WHERE session_id = $1 AND status = 'Pending'`, sess.ID); n != 1 {
		t.Fatal("the refused reverse's operation is no longer Pending: nothing would send it again")
	}
	b.clock.Advance(time.Minute)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	final, _ := b.svc.Get(ctx, sess.ID)
	gp, _ := b.gw.Payment(sess.GatewayPaymentID)
	if final.Status != payments.StatusCanceled || gp.Status != payments.GatewayReversed {
		t.Fatalf("after the patrol: session %s, gateway %s; want Canceled, reversed", final.Status, gp.Status)
	}
	var opID string
	_ = b.pool.QueryRow(ctx, `SELECT id::text FROM reverse_operations WHERE session_id = $1`, sess.ID).Scan(&opID)
	if b.gw.KeyCalls(fakegw.OpReverse, opID) != 2 || b.gw.Calls(fakegw.OpReverse) != 2 {
		t.Fatalf("reverses = %d, want 2 under the operation's key", b.gw.Calls(fakegw.OpReverse))
	}
	if n := b.count(t, `SELECT count(*) FROM reverse_operations WHERE session_id = $1 AND status = 'Succeeded'`, sess.ID); n != 1 {
		t.Fatal("the operation is not Succeeded")
	}
}

// A capture applied between the cancel's commit and its reverse (a check or a webhook: the
// confirm drives without a lease) leaves no reverse to send: none goes to the gateway for a
// payment we already call Completed.
func TestCancelNoReverseAfterACaptureApplied(t *testing.T) {
	t.Parallel()
	var b *bench
	b = newBench(t, func(c *payments.Config) {
		c.Hooks.AfterCancelCommit = func(ctx context.Context, id string) {
			s, _ := b.svc.Get(ctx, id)
			b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
			if got, err := b.svc.Check(ctx, api, id); err != nil || got.Status != payments.StatusCompleted {
				t.Errorf("check in the gap = %s %v", got.Status, err)
			}
		}
	})
	ctx := context.Background()
	sess := b.registered(t, "o-captured-gap", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID))
	wantCode(t, err, payments.ECONFLICT, "captured before the cancel")
	if n := b.gw.Calls(fakegw.OpReverse); n != 0 {
		t.Fatalf("gateway reverses = %d for a payment already Completed, want 0", n)
	}
}

// A confirmed cancel sends its reverse itself, right after its commit; the patrol must not take
// the session up while that reverse may still be in flight (a slow gateway: up to the gateway
// timeout, and a refusal's status read after it). It was due after Backoff[0] (5 s): another
// replica's patrol claimed it and sent the same reverse concurrently (the gateway's 409 in_use,
// counted as a failing gateway; with a gateway that ignores keys, two reverses). Now the first
// look waits RegisterGrace, as a Registering session's does.
func TestConfirmedCancelIsNotThePatrolsWhileItsReverseRuns(t *testing.T) {
	t.Parallel()
	var b *bench
	var other *payments.Service
	b = newBench(t, func(c *payments.Config) {
		c.Hooks.AfterCancelCommit = func(ctx context.Context, id string) {
			// The confirm's reverse is about to go (and may take the gateway's timeout): a
			// patrol round after the old first look.
			b.clock.Advance(payments.DefaultBackoff[0] + time.Second)
			if n, err := other.SweepOnce(ctx); err != nil || n != 0 {
				t.Errorf("another replica's patrol drove %d sessions (%v) while the confirm's reverse was under way", n, err)
			}
		}
	})
	other = b.service(testdb.Pool(t, b.url), "replica-b")
	ctx := context.Background()
	sess := b.registered(t, "o-reverse-in-flight", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID))
	if err != nil || res.Session.Status != payments.StatusCanceled {
		t.Fatalf("confirm = %+v %v", res, err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("gateway reverses = %d, want the confirm's one", n)
	}
}

// A Canceling payment the gateway declined or let expire took no money: the cancel is done with
// nothing to reverse, and the operation says so the same way whichever path learns it — a check
// (or a webhook) before the reverse went out, or the patrol's reverse refused as not reversible.
// The refused path marked it Refused (a failed cancel) outside the apply's transaction, the
// check path Succeeded with no word of why.
func TestCancelOfADeclinedPaymentEndsWithNothingToReverse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, by := range []string{"check", "patrol"} {
		for _, st := range []payments.GatewayStatus{payments.GatewayDeclined, payments.GatewayExpired} {
			t.Run(by+" "+string(st), func(t *testing.T) {
				t.Parallel()
				b := newBench(t)
				sess := b.registered(t, "o-cancel-"+string(st), 1000)
				b.cancelWithLostReverse(t, sess)
				b.gw.SetStatus(sess.GatewayPaymentID, st)
				if by == "check" {
					if _, err := b.svc.Check(ctx, api, sess.ID); err != nil {
						t.Fatal(err)
					}
				} else {
					b.clock.Advance(time.Hour)
					if _, err := b.svc.SweepOnce(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if got, _ := b.svc.Get(ctx, sess.ID); got.Status != payments.StatusFailed {
					t.Fatalf("status %s, want Failed", got.Status)
				}
				var status, detail string
				if err := b.pool.QueryRow(ctx, `SELECT status, detail FROM reverse_operations WHERE session_id = $1`, sess.ID).Scan(&status, &detail); err != nil {
					t.Fatal(err)
				}
				if status != "Succeeded" || detail != "nothing to reverse: the gateway says "+string(st) {
					t.Fatalf("reverse operation %s %q, want Succeeded with nothing to reverse", status, detail)
				}
			})
		}
	}
}

// slowNotifier runs during on its first delivery (the request's own, on the wire), then records.
type slowNotifier struct {
	mu     sync.Mutex
	during func()
	got    []payments.Message
}

func (n *slowNotifier) Notify(_ context.Context, m payments.Message) error {
	n.mu.Lock()
	during := n.during
	n.during = nil
	n.mu.Unlock()
	if during != nil {
		during()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, m)
	return nil
}

// The request that wrote a code's message delivers it itself, under a lease on the row: while
// its notifier call is on the wire, however slow, another replica's patrol does not send the
// same code again. Before, the patrol took any never-tried message past RegisterGrace (30 s) and
// sent it a second time, and the request's record then cleared the patrol's lease.
func TestSlowCodeDeliveryIsNotSentTwice(t *testing.T) {
	t.Parallel()
	n := &slowNotifier{}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	other := b.service(testdb.Pool(t, b.url), "replica-b", func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	sess := b.registered(t, "o-slow-notify", 100)
	n.during = func() {
		b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
		if sent, err := other.DeliverOutbox(ctx); sent != 0 || err != nil {
			t.Errorf("another replica's patrol sent %d messages (%v) while the request's delivery was on the wire", sent, err)
		}
	}
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	got := len(n.got)
	n.mu.Unlock()
	if got != 1 || b.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL AND lease_token IS NULL`) != 1 {
		t.Fatalf("the code was delivered %d times", got)
	}
}

// notifierFunc is a Notifier of one function.
type notifierFunc func(context.Context, payments.Message) error

func (f notifierFunc) Notify(ctx context.Context, m payments.Message) error { return f(ctx, m) }

// The writer's own delivery of a code ends before its lease on the message does: its notifier
// call is bounded by the lease less what it keeps to record the outcome, and the patrol takes
// the message only once the lease is over — never both (an outside review: GATEWAY_TIMEOUT=2s
// gave a 12-s lease and a notifier call of up to 10 s after a lock wait of up to 5 s). The lease
// is never shorter than one notifier POST and its record: with the sessions' lease at 2 s the
// writer still sends (before, it left the code to the patrol's grace), within NotifierTimeout.
// Negative control: without the bound the notifier's context has no deadline.
func TestCodeDeliveryEndsWithinTheWritersLease(t *testing.T) {
	t.Parallel()
	var deadlines []time.Duration
	n := notifierFunc(func(ctx context.Context, _ payments.Message) error {
		dl, ok := ctx.Deadline()
		if !ok {
			dl = time.Now().Add(time.Hour)
		}
		deadlines = append(deadlines, time.Until(dl))
		return nil
	})
	b := newBench(t, func(c *payments.Config) { c.Notifier, c.LeaseDuration = n, 2*time.Second })
	ctx := context.Background()
	sess := b.registered(t, "o-short-lease", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	if len(deadlines) != 1 || deadlines[0] <= 0 || deadlines[0] > payments.NotifierTimeout {
		t.Fatalf("the writer's notifier calls had %v left, want one call bounded by its lease less its record (at most %s)", deadlines, payments.NotifierTimeout)
	}
	b.clock.Advance(payments.StaleAfterFor(0) + 15*time.Second)
	if sent, err := b.svc.DeliverOutbox(ctx); sent != 0 || err != nil {
		t.Fatalf("the patrol sent %d messages (%v) after the writer's delivery, want none", sent, err)
	}
}

// The confirm's own drive of the reverse ends a gateway timeout before the patrol's first look
// may come (the drive can ask the gateway up to four times; a lock wait before the commit eats
// into the grace): what it has not finished by then is the patrol's, never done beside it. With
// a grace no longer than one gateway timeout nothing is left for it: the confirm answers
// Canceling with no reverse sent, and the patrol's first look sends the one reverse.
func TestConfirmedCancelLeavesThePatrolWhatItCannotFinishInTheGrace(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) {
		c.GatewayTimeout, c.RegisterGrace = time.Second, time.Second
		c.Backoff = append([]time.Duration{time.Second}, payments.DefaultBackoff[1:]...)
	})
	ctx := context.Background()
	sess := b.registered(t, "o-cancel-grace", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID))
	if err != nil || res.Session.Status != payments.StatusCanceling {
		t.Fatalf("confirm = %+v %v, want Canceling", res.Session.Status, err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 0 {
		t.Fatalf("reverses sent by the confirm = %d, want none (no time left before the patrol's look)", n)
	}
	b.clock.Advance(time.Second)
	if n, err := b.svc.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("patrol drove %d (%v)", n, err)
	}
	if got, _ := b.svc.Get(ctx, sess.ID); got.Status != payments.StatusCanceled || b.gw.Calls(fakegw.OpReverse) != 1 {
		t.Fatalf("after the patrol: %s with %d reverses, want Canceled with one", got.Status, b.gw.Calls(fakegw.OpReverse))
	}
}

// A reverse the gateway holds past the confirm's deadline (a gateway timeout before the
// patrol's first look may come) is cut there: the confirm answers Canceling, and the patrol's
// first look sends the reverse again with the same key, never while the confirm's is on the
// wire. Without the deadline the confirm's call waits as long as the gateway does.
func TestConfirmedCancelsSlowReverseIsCutBeforeThePatrolsLook(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) {
		c.GatewayTimeout, c.RegisterGrace = time.Second, 1500*time.Millisecond
		c.Backoff = append([]time.Duration{1500 * time.Millisecond}, payments.DefaultBackoff[1:]...)
	})
	ctx := context.Background()
	sess := b.registered(t, "o-cancel-cut", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	gate := b.gw.Hold(fakegw.OpReverse)
	type out struct {
		res payments.ConfirmResult
		err error
	}
	confirmed := make(chan out, 1)
	go func() {
		res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID))
		confirmed <- out{res, err}
	}()
	mustWait(t, gate.Arrived(), "the confirm's reverse at the gateway")
	got := mustWait(t, confirmed, "the confirm, cut at its deadline while the gateway holds the reverse")
	if got.err != nil || got.res.Session.Status != payments.StatusCanceling {
		t.Fatalf("confirm = %s %v, want Canceling", got.res.Session.Status, got.err)
	}
	b.gw.Unhold(fakegw.OpReverse)
	b.clock.Advance(1500 * time.Millisecond)
	if n, err := b.svc.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("patrol drove %d (%v)", n, err)
	}
	if s, _ := b.svc.Get(ctx, sess.ID); s.Status != payments.StatusCanceled {
		t.Fatalf("after the patrol: %s, want Canceled", s.Status)
	}
}

// holdOrderRow takes the order's row lock in a transaction of the test's own and returns its end.
func holdOrderRow(t *testing.T, b *bench, orderID string) func() {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = $1 FOR UPDATE`, orderID); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A cancel code requested while another transaction holds the order was issued with the clock
// read before the lock wait: the customer's message says "It expires in 10 minutes", the API
// answers expires_at, and both were counted from a moment before the code existed, so the code
// died up to one lock_timeout early (time-windows review, session 32; the confirmation side was
// fixed for this in TestACodeIsJudgedWhenItsLocksAreHeld). RequestCancel reads the clock once
// the locks are held. Negative control: the clock read before inTx fails both checks.
func TestACancelCodeLivesItsTTLFromItsIssue(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-tw-issue", 1000)
	release := holdOrderRow(t, b, sess.OrderID)
	type out struct {
		ch  payments.Challenge
		err error
	}
	done := make(chan out, 1)
	go func() {
		ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
		done <- out{ch, err}
	}()
	waitLockWaiters(t, b.pool, 1)
	b.clock.Advance(4 * time.Second) // the request waits 4 s for the order (lock_timeout is 5 s)
	release()
	got := mustWait(t, done, "the cancel request")
	if got.err != nil {
		t.Fatal(got.err)
	}
	issued := b.clock.Now() // the code exists from here on; the message was sent now
	if want := issued.Add(10 * time.Minute); got.ch.ExpiresAt.Before(want) {
		t.Errorf("code issued at %s expires at %s: %s before the 10 minutes its message promises",
			issued.Format(time.TimeOnly), got.ch.ExpiresAt.Format(time.TimeOnly), want.Sub(got.ch.ExpiresAt))
	}
	// The customer reads the code out 9m58s after it was sent: within the promised 10 minutes.
	b.clock.Advance(10*time.Minute - 2*time.Second)
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, got.ch.ID, b.lastCode(t, sess.ID)); err != nil {
		t.Errorf("confirm 9m58s after the code was sent (message: \"expires in 10 minutes\") = %v", err)
	}
}

// Support's refund form sent again while its code is "still open" answers that code and sends
// nothing (RequestRefundCode). "Still open" was judged with the clock read before the wait for
// the payment's locks: a code that expired during the wait was handed back as open, no new code
// went to the customer, and the code support then typed was refused as expired (time-windows
// review, session 32). Negative control: the clock read before inTx fails both checks.
func TestARefundCodeIsReusedOnlyWhileOpenOnceTheLocksAreHeld(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	paid := b.completed(t, "o-tw-reuse", 1000)
	form := staffRefund(paid.ID, 400, uuid.NewString())
	first, err := b.svc.RequestRefundCode(ctx, supportStaff, form)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(10*time.Minute - time.Second) // a second before the first code expires
	release := holdOrderRow(t, b, paid.OrderID)
	type out struct {
		ch  payments.Challenge
		err error
	}
	done := make(chan out, 1)
	go func() {
		ch, err := b.svc.RequestRefundCode(ctx, supportStaff, form) // the same form again
		done <- out{ch, err}
	}()
	waitLockWaiters(t, b.pool, 1)
	b.clock.Advance(2 * time.Second) // the first code expires while the request waits
	release()
	got := mustWait(t, done, "the second refund code request")
	if got.err != nil {
		t.Fatal(got.err)
	}
	now := b.clock.Now()
	if !got.ch.ExpiresAt.After(now) {
		t.Errorf("the form's code was answered as still open (challenge %s, first %s) though it expired at %s, before now %s",
			got.ch.ID, first.ID, got.ch.ExpiresAt.Format(time.TimeOnly), now.Format(time.TimeOnly))
	}
	if _, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, got.ch.ID, b.lastCode(t, paid.ID)); err != nil {
		t.Errorf("confirming the code the form was answered with = %v (%s)", err, payments.ErrorCode(err))
	}
}

// The console's "Request cancel" carries an intent key (RequestCancelOnce): the same form sent
// twice at once — a double click, both requests waiting on the payment's locks — sends the
// customer one code, and both answers name it. A new form (another key) sends a new code, as
// does the same form once its code is dead. A double click sent two codes, the first dead on
// arrival, and spent two of the payment's three code requests of the hour (staff-concurrency
// review, session 32). Negative control: RequestCancelOnce ignoring its key sends two.
func TestACancelFormSentTwiceSendsOneCode(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-cancel-twice", 1000)
	codes := func() int {
		return b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND kind = 'cancel_code'`, sess.ID)
	}
	intent := uuid.NewString()
	release := holdOrderRow(t, b, sess.OrderID)
	type out struct {
		ch  payments.Challenge
		err error
	}
	clicks := make(chan out, 2)
	for range 2 {
		go func() {
			ch, err := b.svc.RequestCancelOnce(ctx, supportStaff.Actor(), sess.ID, intent)
			clicks <- out{ch, err}
		}()
	}
	waitLockWaiters(t, b.pool, 2)
	release()
	first, second := mustWait(t, clicks, "the first click"), mustWait(t, clicks, "the second click")
	if first.err != nil || second.err != nil || first.ch.ID != second.ch.ID {
		t.Fatalf("two clicks of one form = %+v, %+v: want one challenge for both", first, second)
	}
	if n := codes(); n != 1 {
		t.Fatalf("codes sent for one form clicked twice = %d, want 1", n)
	}

	// Another form (the page loaded again): a new code, replacing the first.
	other, err := b.svc.RequestCancelOnce(ctx, supportStaff.Actor(), sess.ID, uuid.NewString())
	if err != nil || other.ID == first.ch.ID || codes() != 2 {
		t.Fatalf("another form = %+v %v, codes %d: want a new code", other, err, codes())
	}
	// The first form again: its code was replaced, so it gets a new one too.
	again, err := b.svc.RequestCancelOnce(ctx, supportStaff.Actor(), sess.ID, intent)
	if err != nil || again.ID == first.ch.ID || codes() != 3 {
		t.Fatalf("the first form after its code was replaced = %+v %v, codes %d: want a new code", again, err, codes())
	}
	_, err = b.svc.RequestCancelOnce(ctx, supportStaff.Actor(), sess.ID, "not-a-key")
	wantCode(t, err, payments.EINVALID, "reload the page")
}

// A payment id is taken in any letter case (a uuid column matches either), but the core's staff
// audit entry of a cancel confirmed by support took its target from the id as the caller typed
// it: sent in upper case, the money-moving action was audited under a target the payment's page
// and the audit filtered on the payment never show. The core audits the id as stored (the
// console's path ids are canonical too: TestAStaffActionOnAnUpperCaseIDIsOnThePaymentsAudit).
// From an outside review; negative control: ConfirmCancel with the id as typed (0 shown).
func TestAStaffCancelOfAnUpperCaseIDIsOnThePaymentsAudit(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()

	// A cancel confirmed by support, with the path's id in upper case.
	s := b.registered(t, "o-audit-case-cancel", 700)
	upper := strings.ToUpper(s.ID)
	ch, err := b.svc.RequestCancel(ctx, supportStaff.Actor(), upper)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, supportStaff.Actor(), upper, ch.ID, b.lastCode(t, s.ID)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1`, payments.AuditCancelConfirm); n != 1 {
		t.Fatalf("cancel confirmed: %d audit entries in all, want 1", n)
	}
	d, err := b.svc.PaymentDetail(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	shown := 0
	for _, e := range d.Audit {
		if e.Action == payments.AuditCancelConfirm {
			shown++
		}
	}
	log, err := b.svc.AuditLog(ctx, payments.AuditFilter{Target: s.ID})
	if err != nil {
		t.Fatal(err)
	}
	if shown != 1 || len(log) != 1 {
		got := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2`, payments.AuditCancelConfirm, upper)
		t.Fatalf("support's cancel of %s: the payment's page shows %d cancel_confirm entries, the audit log filtered on the payment shows %d; "+
			"%d entry is filed under %q instead", s.ID, shown, len(log), got, upper)
	}
}
