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

// failFirstNotifier holds its first message until released, then fails it; later ones are
// recorded and accepted.
type failFirstNotifier struct {
	mu      sync.Mutex
	calls   int
	got     []payments.Message
	entered chan struct{}
	release chan struct{}
}

func (n *failFirstNotifier) Notify(ctx context.Context, m payments.Message) error {
	n.mu.Lock()
	n.calls++
	first := n.calls == 1
	if !first {
		n.got = append(n.got, m)
	}
	n.mu.Unlock()
	if !first {
		return nil
	}
	close(n.entered)
	<-n.release
	return errors.New("503 from the notifier")
}

// A refund code whose room went away while its first POST was on the wire was redacted by the
// housekeeping (its lease live: redacted, not skipped), and the POST failed. Once the code could
// be used again — the room back (the proposal rejected), or an admin having read the outbox (a
// read code is never 'no_room') — the patrol's retry sent the redacted text ("your code is
// ••••••") and marked it delivered, the challenge still open: the same form answered it as sent
// and sent nothing (a review of outbound deliveries). A message whose text no longer holds its
// code is skipped ('redacted') and its challenge superseded: the form sent again issues a new
// code, which is sent. Negative control (run by hand): without 'redacted', both fail.
func TestARedactedCodeMessageIsNeverSent(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"room back", "admin read the outbox"} {
		t.Run(how, func(t *testing.T) { t.Parallel(); redactedNeverSent(t, how) })
	}
}

func redactedNeverSent(t *testing.T, how string) {
	n := &failFirstNotifier{entered: make(chan struct{}), release: make(chan struct{})}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	paid := b.completed(t, "o-redacted-"+uuid.NewString()[:8], 1000)
	type res struct {
		ch  payments.Challenge
		err error
	}
	done := make(chan res, 1)
	intent := uuid.NewString()
	go func() {
		ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, intent))
		done <- res{ch, err}
	}()
	<-n.entered // the writer's POST is on the wire
	code := b.lastCode(t, paid.ID)
	fr, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(paid.ID, 500, uuid.NewString()))
	if err != nil || fr.Proposal == nil {
		t.Fatalf("finance's proposal = %+v %v", fr, err)
	}
	if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	close(n.release) // the POST fails
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if how == "room back" {
		if _, err := b.svc.RejectResolution(ctx, fin2, fr.Proposal.ID, "no"); err != nil {
			t.Fatal(err)
		}
	} else if _, err := b.svc.Outbox(ctx, payments.Staff{Email: "admin@example.com", Role: "admin"}, paid.ID); err != nil {
		t.Fatal(err) // the admin looks at the failing message (its text is redacted already)
	}
	b.clock.Advance(2 * time.Minute)
	if _, err := b.svc.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	got := append([]payments.Message(nil), n.got...)
	n.mu.Unlock()
	for _, m := range got {
		if !strings.Contains(m.Text, code) {
			t.Errorf("the customer was sent a code message without its code: %q (the challenge %s is still open: %d)", m.Text, r.ch.ID,
				b.count(t, `SELECT count(*) FROM cancel_challenges WHERE id = $1 AND superseded_at IS NULL AND consumed_at IS NULL`, r.ch.ID))
		}
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE challenge_id = $1 AND skip_reason = 'redacted' AND delivered_at IS NULL`, r.ch.ID); n != 1 {
		t.Errorf("the message is not skipped as withdrawn (%d)", n)
	}
	// Support sends the form again: a new code, not the withdrawn one answered as sent.
	if how == "admin read the outbox" {
		return // the room is still a proposal's: a new refund code is refused, as it should be
	}
	again, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, intent))
	if err != nil || again.Reused || again.ID == r.ch.ID {
		t.Fatalf("the form sent again: %+v %v; want a new code", again, err)
	}
}
