package payments_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// answerThen is the fake gateway whose status answer, the first time only, is held back while
// then runs: the answer was given, and something else decides before it is applied.
type answerThen struct {
	*fakegw.Gateway
	once sync.Once
	then func()
}

func (g *answerThen) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	gp, err := g.Gateway.Status(ctx, id)
	g.once.Do(func() {
		if g.then != nil {
			g.then()
		}
	})
	return gp, err
}

// newAnswerThenBench is a bench whose gateway runs gw.then once, right after its first status
// answer.
func newAnswerThenBench(t *testing.T) (*bench, *answerThen) {
	gw := &answerThen{}
	b := newBench(t, func(c *payments.Config) {
		gw.Gateway = c.Gateway.(*fakegw.Gateway)
		c.Gateway = gw
	})
	return b, gw
}

// An answer the gateway gave before another decision, applied after it, is not the gateway's
// word about the new state: it opens no finance case. The gateway is asked again about the
// session as it is now, and that answer stands (audit 5, F1: two checks on two replicas, the
// patrol against a webhook, a check against a cancel each opened a false case). Each case here
// holds the first answer back while the other decision is made, on purpose.
func TestAnswerOvertakenByANewerDecisionOpensNoCase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type run struct {
		name string
		// overtake moves the session on (the payment is at the gateway as status says).
		overtake func(t *testing.T, b *bench, sess payments.Session)
		want     payments.Status
		entries  int
	}
	runs := []run{
		{name: "a check overtaken by a check that completed it", want: payments.StatusCompleted, entries: 1,
			overtake: func(t *testing.T, b *bench, sess payments.Session) {
				b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
				if got, err := b.plain.Check(ctx, api, sess.ID); err != nil || got.Status != payments.StatusCompleted {
					t.Errorf("the other check = %s %v", got.Status, err)
				}
			}},
		{name: "a check overtaken by a cancel", want: payments.StatusCanceled, entries: 0,
			overtake: func(t *testing.T, b *bench, sess payments.Session) {
				ch, err := b.plain.RequestCancel(ctx, api, sess.ID)
				if err != nil {
					t.Error(err)
					return
				}
				if res, err := b.plain.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID)); err != nil || res.Session.Status != payments.StatusCanceled {
					t.Errorf("the cancel = %+v %v", res, err)
				}
			}},
	}
	for _, r := range runs {
		for _, by := range []string{"check", "patrol"} {
			t.Run(r.name+", by the "+by, func(t *testing.T) {
				t.Parallel()
				b, gw := newAnswerThenBench(t)
				sess := b.registered(t, "o-overtaken", 1000)
				b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewayAuthorized)
				if got, err := b.plain.Check(ctx, api, sess.ID); err != nil || got.Status != payments.StatusAuthorized {
					t.Fatalf("setup check = %s %v", got.Status, err)
				}
				gw.then = func() { r.overtake(t, b, sess) } // the answer "authorized" is given, then this
				before := b.gw.Calls(fakegw.OpStatus)
				if by == "check" {
					if _, err := b.svc.Check(ctx, api, sess.ID); err != nil {
						t.Fatalf("check: %v", err)
					}
				} else {
					b.clock.Advance(time.Hour)
					if _, err := b.svc.SweepOnce(ctx); err != nil {
						t.Fatalf("sweep: %v", err)
					}
				}
				got, err := b.plain.Get(ctx, sess.ID)
				if err != nil || got.Status != r.want {
					t.Fatalf("status = %s %v, want %s", got.Status, err, r.want)
				}
				if n := b.count(t, `SELECT count(*) FROM finance_cases`); n != 0 {
					var kind, detail string
					_ = b.pool.QueryRow(ctx, `SELECT kind, detail FROM finance_cases LIMIT 1`).Scan(&kind, &detail)
					t.Fatalf("%d finance case(s), first %s: %q; want none", n, kind, detail)
				}
				if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, sess.ID); n != r.entries {
					t.Fatalf("ledger entries = %d, want %d", n, r.entries)
				}
				// The held answer, the other decision's own question, and one question again. The
				// patrol asks nothing again: the other decision's final state ended its lease, and
				// a drive whose lease ended writes nothing (TestApprovalEndsTheLeaseOfADriveInFlight).
				least := 2
				if by == "patrol" {
					least = 1
				}
				if n := b.gw.Calls(fakegw.OpStatus) - before; n < least || n > 3 {
					t.Fatalf("status calls = %d, want the held one, the other's (a check) and, but for the patrol, one again", n)
				}
			})
		}
	}
}

// A contradiction that is real survives the second question: the gateway says pending for a
// Completed session both times, and the case is opened.
func TestARealContradictionSurvivesTheSecondQuestion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, gw := newAnswerThenBench(t)
	sess := b.registered(t, "o-real", 1000)
	gw.then = func() {
		b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
		if got, err := b.plain.Check(ctx, api, sess.ID); err != nil || got.Status != payments.StatusCompleted {
			t.Errorf("the other check = %s %v", got.Status, err)
		}
		b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewayPending) // the gateway then says pending: a lie, but its word
	}
	if _, err := b.svc.Check(ctx, api, sess.ID); err != nil {
		t.Fatalf("check: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE kind = 'gateway_mismatch' AND session_id = $1`, sess.ID); n != 1 {
		t.Fatalf("gateway_mismatch cases = %d, want 1", n)
	}
}

// An overtaken answer is asked about again only while the caller still has time: a check whose
// context ended meanwhile (a replica shutting down, a drive past its deadline) lets the newer
// decision stand and asks nothing more; before, the second ask ran detached from any deadline.
func TestOvertakenAnswerIsNotAskedAgainAfterTheCallerStopped(t *testing.T) {
	t.Parallel()
	b, gw := newAnswerThenBench(t)
	sess := b.registered(t, "o-overtaken-stop", 1000)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewayAuthorized)
	if got, err := b.plain.Check(context.Background(), api, sess.ID); err != nil || got.Status != payments.StatusAuthorized {
		t.Fatalf("setup check = %s %v", got.Status, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw.then = func() { // "authorized" is answered, then a check completes it, then the caller stops
		b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
		if got, err := b.plain.Check(context.Background(), api, sess.ID); err != nil || got.Status != payments.StatusCompleted {
			t.Errorf("the other check = %s %v", got.Status, err)
		}
		cancel()
	}
	before := b.gw.Calls(fakegw.OpStatus)
	if got, err := b.svc.Check(ctx, api, sess.ID); err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("check = %s %v, want the newer decision", got.Status, err)
	}
	if n := b.gw.Calls(fakegw.OpStatus) - before; n != 2 {
		t.Fatalf("status calls = %d, want the held one and the other check's, nothing asked after the stop", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases`); n != 0 {
		t.Fatalf("%d finance cases", n)
	}
}
