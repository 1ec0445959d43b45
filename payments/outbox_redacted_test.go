package payments_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/payments"
)

// codeNotifier holds its first message until released, then answers it with an error (reached:
// the customer got it and the answer was lost; otherwise it failed); later ones are accepted.
// Every message that reached the customer is recorded.
type codeNotifier struct {
	reached  bool
	mu       sync.Mutex
	calls    int
	received []payments.Message
	entered  chan struct{}
	release  chan struct{}
}

func newCodeNotifier(reached bool) *codeNotifier {
	return &codeNotifier{reached: reached, entered: make(chan struct{}), release: make(chan struct{})}
}

func (n *codeNotifier) Notify(ctx context.Context, m payments.Message) error {
	n.mu.Lock()
	n.calls++
	first := n.calls == 1
	if !first || n.reached {
		n.received = append(n.received, m)
	}
	n.mu.Unlock()
	if !first {
		return nil
	}
	close(n.entered)
	<-n.release
	return errors.New("notify: 503, or its answer lost")
}

// codeOnItsWay is a refund code whose first POST (n) is on the wire when finance's proposal takes
// the payment's room (the code dead for want of room) and the housekeeping runs; then the POST
// ends (n released). It returns the code, its challenge and the proposal.
func codeOnItsWay(t *testing.T, b *bench, n *codeNotifier, paid payments.Session, intent string) (string, payments.Challenge, *payments.Resolution) {
	t.Helper()
	ctx := context.Background()
	type res struct {
		ch  payments.Challenge
		err error
	}
	done := make(chan res, 1)
	go func() {
		ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, intent))
		done <- res{ch, err}
	}()
	<-n.entered
	code := b.lastCode(t, paid.ID)
	fr, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(paid.ID, 500, uuid.NewString()))
	if err != nil || fr.Proposal == nil {
		t.Fatalf("finance's proposal = %+v %v", fr, err)
	}
	if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	close(n.release)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return code, r.ch, fr.Proposal
}

// A refund code whose room went away while its first POST was on the wire was redacted by the
// housekeeping (its lease live: redacted, not skipped). If the POST had reached the customer
// (its answer lost), or once the code could be used again after it failed — the room back (the
// proposal rejected), or an admin having read the outbox (a read code is never 'no_room') — the
// retry sent "your code is ••••••" and marked it delivered (a review of outbound deliveries), or,
// skipped as withdrawn, the code the customer held stopped working (a review of that fix). A
// code on its way is not redacted for want of room: its delivery ends first, and the claim skips
// it if it is still dead. Whatever was sent held the code, and the code confirms the refund.
// Negative control (run by hand): redacted on its way, each fails.
func TestACodeOnItsWayIsNotWithdrawnForWantOfRoom(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"room back", "admin read the outbox", "answer lost"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			n := newCodeNotifier(how == "answer lost")
			b := newBench(t, func(c *payments.Config) { c.Notifier = n })
			ctx := context.Background()
			paid := b.completed(t, "o-on-its-way-"+uuid.NewString()[:8], 1000)
			code, ch, proposal := codeOnItsWay(t, b, n, paid, uuid.NewString())
			if how == "admin read the outbox" {
				if _, err := b.svc.Outbox(ctx, payments.Staff{Email: "admin@example.com", Role: "admin"}, paid.ID); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.svc.RejectResolution(ctx, fin2, proposal.ID, "no"); err != nil {
				t.Fatal(err)
			}
			b.clock.Advance(2 * time.Minute)
			if _, err := b.svc.DeliverOutbox(ctx); err != nil {
				t.Fatal(err)
			}
			n.mu.Lock()
			received := append([]payments.Message(nil), n.received...)
			n.mu.Unlock()
			for _, m := range received {
				if !strings.Contains(m.Text, code) {
					t.Errorf("the customer was sent a code message without its code: %q", m.Text)
				}
			}
			if len(received) == 0 {
				t.Fatal("the code never reached the customer")
			}
			if _, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, ch.ID, code); err != nil {
				t.Errorf("the customer reads out the code they received: %v (skips: %v)", err,
					b.texts(t, `SELECT coalesce(skip_reason, '-') FROM outbox WHERE challenge_id = $1`, ch.ID))
			}
		})
	}
}

// A code message whose text no longer holds its code (redacted on its way by a release before
// the rule above) is never sent as "••••••": it is skipped ('redacted'), its challenge superseded,
// and the same form sent again issues a new code, which is sent. Negative control (run by hand):
// without 'redacted' in deadCodeSQL, the masked text is sent.
func TestAMessageWhoseCodeIsGoneIsNeverSent(t *testing.T) {
	t.Parallel()
	n := newCodeNotifier(false)
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	paid := b.completed(t, "o-code-gone", 1000)
	intent := uuid.NewString()
	_, ch, proposal := codeOnItsWay(t, b, n, paid, intent)
	b.exec(t, `UPDATE outbox SET body = redacted_body WHERE challenge_id = $1`, ch.ID) // as the release before redacted it
	if _, err := b.svc.RejectResolution(ctx, fin2, proposal.ID, "no"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(2 * time.Minute)
	if _, err := b.svc.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	sent := len(n.received)
	n.mu.Unlock()
	if sent != 0 || b.count(t, `SELECT count(*) FROM outbox WHERE challenge_id = $1 AND skip_reason = 'redacted'`, ch.ID) != 1 {
		t.Fatalf("%d masked messages sent; skips %v", sent, b.texts(t, `SELECT coalesce(skip_reason, '-') FROM outbox WHERE challenge_id = $1`, ch.ID))
	}
	again, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, intent))
	if err != nil || again.Reused || again.ID == ch.ID {
		t.Fatalf("the form sent again: %+v %v; want a new code", again, err)
	}
}

// An admin read the outbox (the code in clear: their statement's snapshot) at the moment the
// housekeeping redacted the code (no room: a finance proposal), its writer's POST on the wire;
// the POST failed. The admin relayed the code they read; the room came back; the code the
// customer held was withdrawn (a review of b4cee4a). Not redacted on its way, it confirms the
// refund. Negative control (run by hand): redacted on its way, refused.
func TestARelayedCodeReadAsTheHousekeepingRanStillWorks(t *testing.T) {
	t.Parallel()
	n := newCodeNotifier(false)
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	paid := b.completed(t, "o-relayed-"+uuid.NewString()[:8], 1000)
	type res struct {
		ch  payments.Challenge
		err error
	}
	done := make(chan res, 1)
	go func() {
		ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, uuid.NewString()))
		done <- res{ch, err}
	}()
	<-n.entered
	code := b.lastCode(t, paid.ID)
	fr, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(paid.ID, 500, uuid.NewString()))
	if err != nil || fr.Proposal == nil {
		t.Fatalf("proposal: %+v %v", fr, err)
	}
	// Hold the admin's statement after its snapshot (its seen_by update waits on the challenge).
	holder, _ := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM cancel_challenges WHERE session_id = $1 FOR UPDATE`, paid.ID); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		msgs []payments.OutboxMessage
		err  error
	}
	read := make(chan seen, 1)
	go func() {
		m, err := b.svc.Outbox(ctx, payments.Staff{Email: "admin@example.com", Role: "admin"}, paid.ID)
		read <- seen{m, err}
	}()
	waitLockWaiters(t, b.pool, 1)
	if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	s := <-read
	if s.err != nil {
		t.Fatal(s.err)
	}
	relayed := false
	for _, m := range s.msgs {
		if strings.Contains(m.Body, code) {
			relayed = true
		}
	}
	if !relayed {
		t.Fatalf("the admin did not see the code: %+v", s.msgs)
	}
	close(n.release)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, err := b.svc.RejectResolution(ctx, fin2, fr.Proposal.ID, "no"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(2 * time.Minute)
	if _, err := b.svc.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, r.ch.ID, code); err != nil {
		t.Errorf("the admin read the code in clear and relayed it; support reads it out and gets: %v (skip: %v)", err,
			b.texts(t, `SELECT coalesce(skip_reason, '-') FROM outbox WHERE challenge_id = $1`, r.ch.ID))
	}
}
