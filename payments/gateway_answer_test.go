package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// afterMismatch asserts what a gateway answer for another amount or currency must leave: the
// session in the state it had, flagged, exactly one open gateway_mismatch case, no ledger entry
// and the order still awaiting payment.
func (b *bench) afterMismatch(t *testing.T, sess payments.Session, want payments.Status) {
	t.Helper()
	got, err := b.plain.Get(context.Background(), sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != want {
		t.Fatalf("status = %s, want %s (a mismatched answer moved the session)", got.Status, want)
	}
	if got.FlaggedAt == nil || got.FlagReason == "" {
		t.Fatalf("session not flagged: %+v", got)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL`, sess.ID); n != 1 {
		t.Fatalf("gateway_mismatch cases = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = $1`, sess.OrderID); n != 0 {
		t.Fatalf("ledger entries = %d, want 0", n)
	}
	if n := b.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'AwaitingPayment'`, sess.OrderID); n != 1 {
		t.Fatal("the order is no longer awaiting payment")
	}
}

// The gateway says "succeeded" — for 1.00 on a 99.00 session, or for 99.00 in another currency.
// Every path that applies a gateway payment (Check, the sweeper's drive, a webhook hint,
// reconciliation) refuses it: no Completed, no PaymentReceived, a flag and one case. Without the
// comparison each of these completes the payment and books 99.00 (fails on the main before it).
func TestGatewayAnswerForAnotherAmountIsNeverApplied(t *testing.T) {
	t.Parallel()
	paths := map[string]func(t *testing.T, b *bench, s payments.Session){
		"check": func(t *testing.T, b *bench, s payments.Session) {
			if _, err := b.svc.Check(context.Background(), api, s.ID); err != nil {
				t.Fatal(err)
			}
		},
		"sweeper": func(t *testing.T, b *bench, s payments.Session) {
			b.clock.Advance(time.Minute)
			if n, err := b.svc.SweepOnce(context.Background()); err != nil || n != 1 {
				t.Fatalf("sweep = %d %v", n, err)
			}
		},
		"webhook hint": func(t *testing.T, b *bench, s payments.Session) {
			if _, err := b.svc.ApplyGatewayHint(context.Background(), payments.Actor{Kind: payments.ActorWebhook, ID: "evt_1"}, s.GatewayPaymentID, ""); err != nil {
				t.Fatal(err)
			}
		},
		"reconciliation": func(t *testing.T, b *bench, s payments.Session) {
			b.clock.Advance(time.Minute)
			if rep := reconcile(t, b.svc, payments.ReconcileConfig{}); rep.Checked != 1 || rep.Mismatches != 1 {
				t.Fatalf("reconcile = %+v", rep)
			}
		},
	}
	answers := []struct {
		name     string
		amount   int64
		currency string
	}{{"amount", 100, "EUR"}, {"currency", 9900, "USD"}}
	for name, apply := range paths {
		for _, a := range answers {
			t.Run(name+"/"+a.name, func(t *testing.T) {
				t.Parallel()
				b := newBench(t)
				s := b.registered(t, "o-mismatch", 9900)
				b.gw.SetAmount(s.GatewayPaymentID, a.amount, a.currency)
				b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
				apply(t, b, s)
				b.afterMismatch(t, s, payments.StatusRegistered)
				// Asked again (a webhook redelivery, the next Check): still nothing applied, still one case.
				if _, err := b.svc.Check(context.Background(), api, s.ID); err != nil {
					t.Fatal(err)
				}
				b.afterMismatch(t, s, payments.StatusRegistered)
			})
		}
	}
}

// A Completed session whose gateway payment turns out to be for another amount (reconciliation
// compares it) gets a gateway_mismatch case; the ledger is not touched again.
func TestReconcileCompletedForAnotherAmountOpensCase(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s := b.completed(t, "o-done", 9900)
	b.gw.SetAmount(s.GatewayPaymentID, 100, "EUR")
	b.clock.Advance(time.Minute)
	if rep := reconcile(t, b.svc, payments.ReconcileConfig{}); rep.Mismatches != 1 {
		t.Fatalf("reconcile = %+v", rep)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); n != 1 {
		t.Fatalf("cases = %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = $1`, s.OrderID); n != 1 {
		t.Fatalf("ledger entries = %d, want the one PaymentReceived", n)
	}
}

// A refund answer for another amount than the refund asked for is not booked: the refund stays
// Pending, no RefundIssued entry, one gateway_mismatch case.
func TestRefundAnswerForAnotherAmountIsNeverApplied(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s := b.completed(t, "o-refund-mismatch", 1000)
	b.gw.MisreportRefunds(999)
	r, err := b.svc.CreateRefund(context.Background(), api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Refund.Status != payments.RefundPending {
		t.Fatalf("refund = %+v, want Pending", r.Refund)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 0 {
		t.Fatalf("RefundIssued entries = %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); n != 1 {
		t.Fatalf("cases = %d", n)
	}
}

// The gateway's confirmation_url is stored (and so ever shown or redirected to) only when it is
// https, or on the configured gateway's own origin. Anything else — a javascript: URL, plain
// http elsewhere, user info, a relative URL — is dropped: the answer's state still applies, the
// session is flagged and one untrusted_confirmation_url case opens. The main before this change
// stored whatever the gateway said.
func TestConfirmationURLMustBeHTTPSOrTheGatewaysOrigin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url   string
		trust bool
	}{
		{"https://pay.example.com/p/1", true},
		{"http://127.0.0.1:8090/pay/1", true}, // GatewayURL's origin
		{"http://localhost:8090/pay/1", true}, // the same loopback origin
		{"javascript:alert(document.cookie)", false},
		{"JavaScript:alert(1)//https://pay.example.com", false},
		{"http://evil.example/pay/1", false},
		{"http://127.0.0.1:8091/pay/1", false}, // another port
		{"https://user:pw@evil.example/pay", false},
		{"data:text/html,<script>alert(1)</script>", false},
		{"//evil.example/pay", false},
		{"/pay/1", false},
	} {
		t.Run(tc.url, func(t *testing.T) {
			t.Parallel()
			checkConfirmationURL(t, tc.url, tc.trust, func(c *payments.Config) { c.GatewayURL = "http://127.0.0.1:8090" })
		})
	}
}

// checkConfirmationURL registers a payment whose answer names url on a service configured by
// cfg: a trusted URL is stored as it is; an untrusted one is dropped, the session flagged and one
// untrusted_confirmation_url case opened. The answer's state applies either way.
func checkConfirmationURL(t *testing.T, url string, trust bool, cfg func(*payments.Config)) {
	t.Helper()
	b := newBench(t, cfg)
	b.gw.SetConfirmationURL(url)
	res, err := b.svc.Create(context.Background(), api, payments.CreateInput{OrderID: "o-url", Amount: 100, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Session
	if s.Status != payments.StatusRegistered || s.GatewayPaymentID == "" {
		t.Fatalf("session %+v: the answer's state must still apply", s)
	}
	cases := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'untrusted_confirmation_url'`, s.ID)
	if trust {
		if s.ConfirmationURL != url || s.FlaggedAt != nil || cases != 0 || !b.svc.TrustedConfirmationURL(url) {
			t.Fatalf("trusted URL: session %+v, %d cases", s, cases)
		}
		return
	}
	if s.ConfirmationURL != "" || s.FlaggedAt == nil || cases != 1 || b.svc.TrustedConfirmationURL(url) {
		t.Fatalf("untrusted URL: session %+v, %d cases; want it dropped, flagged, one case", s, cases)
	}
}

// With GATEWAY_CONFIRMATION_HOSTS set, "https" is not enough: the page must be on a listed host
// (or a subdomain of a "*." entry). The gateway's own origin stays trusted. A URL off the list is
// dropped, the session flagged and one untrusted_confirmation_url case opened, the answer's
// state applied — as for any untrusted URL. Without the list any https host was accepted.
func TestConfirmationHostsNarrowHTTPS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url   string
		trust bool
	}{
		{"https://hooks.stripe.com/redirect/1", true},
		{"https://HOOKS.stripe.com./redirect/1", true},
		{"https://acs.pay.example.com/3ds", true},
		{"https://a.b.pay.example.com/3ds", true},
		{"http://127.0.0.1:8090/pay/1", true},  // the gateway's own origin
		{"https://pay.example.com/p/1", false}, // "*." is subdomains only
		{"https://evil.example/pay/1", false},
		{"https://hooks.stripe.com.evil.example/pay", false},
		{"https://evilpay.example.com/pay", false},
		{"http://hooks.stripe.com/redirect/1", false}, // listed, but not https
	} {
		t.Run(tc.url, func(t *testing.T) {
			t.Parallel()
			checkConfirmationURL(t, tc.url, tc.trust, func(c *payments.Config) {
				c.GatewayURL = "http://127.0.0.1:8090"
				c.ConfirmationHosts = []string{"hooks.stripe.com", "*.pay.example.com"}
			})
		})
	}
}

// strangerGateway answers a registration with a payment that is not the session's: the same
// amount and currency, another reference (another merchant's or another session's payment, as a
// gateway whose idempotency store mixed keys up would), in the status given.
type strangerGateway struct {
	*fakegw.Gateway
	status payments.GatewayStatus
	more   int64 // the stranger's payment is for this much more than the session's
}

func (g strangerGateway) Register(_ context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	return payments.GatewayPayment{ID: "gp_stranger", Status: g.status, Amount: req.Amount + g.more, Currency: req.Currency,
		Reference: "someone-else", ConfirmationURL: "https://fake.gateway/pay/gp_stranger"}, nil
}

// A registration answer is taken by its idempotency key alone: one whose reference is not the
// session's is never attached nor applied — no Completed, no PaymentReceived, the session
// flagged with one gateway_mismatch case (its stranger payment may belong to a session that must
// still attach it). The main before this change attached gp_stranger and, when it said
// succeeded, completed the order and booked it (an outside review).
func TestRegistrationAnswerForAnotherReferenceIsNeverAttached(t *testing.T) {
	t.Parallel()
	for _, st := range []payments.GatewayStatus{payments.GatewaySucceeded, payments.GatewayPending} {
		t.Run(string(st), func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			svc := b.service(b.pool, "replica-stranger", func(c *payments.Config) { c.Gateway = strangerGateway{b.gw, st, 0} })
			res, err := svc.Create(context.Background(), api, payments.CreateInput{OrderID: "o-stranger", Amount: 1999, Currency: "EUR"})
			if err != nil {
				t.Fatal(err)
			}
			got, err := b.plain.Get(context.Background(), res.Session.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.GatewayPaymentID != "" || got.Status == payments.StatusCompleted {
				t.Fatalf("session %s attached %q: another reference's payment was taken for it", got.Status, got.GatewayPaymentID)
			}
			b.afterMismatch(t, got, got.Status)
		})
	}
}

// refundGateway answers refunds as the fake does, then rewrites them: the refund request's
// answer names no payment (noPayment), a refund's look-up by id answers about another refund
// (otherRefund).
type refundGateway struct {
	*fakegw.Gateway
	noPayment, otherRefund bool
}

func (g refundGateway) Refund(ctx context.Context, id, key string, amount int64, cur string) (payments.GatewayRefund, error) {
	r, err := g.Gateway.Refund(ctx, id, key, amount, cur)
	if g.noPayment {
		r.PaymentID = ""
	}
	return r, err
}

func (g refundGateway) RefundStatus(ctx context.Context, rid string) (payments.GatewayRefund, error) {
	r, err := g.Gateway.RefundStatus(ctx, rid)
	if g.otherRefund {
		r.ID, r.Status = "rf_other", "succeeded"
	}
	return r, err
}

// A refund answer is booked only when it names the session's gateway payment and, read by its
// id, that same refund: an answer naming no payment (the contract's refund object always names
// one) or another refund stays Pending with one gateway_mismatch case and no RefundIssued. The
// main before this change booked both (an outside review: "succeeded" with no payment_id, while
// the gateway had refunded nothing).
func TestRefundAnswerAboutAnotherRefundIsNeverApplied(t *testing.T) {
	t.Parallel()
	after := func(t *testing.T, b *bench, s payments.Session, r payments.Refund) {
		t.Helper()
		if r.Status != payments.RefundPending {
			t.Fatalf("refund = %+v, want Pending", r)
		}
		if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 0 {
			t.Fatalf("RefundIssued entries = %d", n)
		}
		if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); n != 1 {
			t.Fatalf("cases = %d", n)
		}
	}
	t.Run("no payment", func(t *testing.T) {
		t.Parallel()
		b := newBench(t)
		s := b.completed(t, "o-refund-anon", 1000)
		svc := b.service(b.pool, "replica-anon", func(c *payments.Config) { c.Gateway = refundGateway{Gateway: b.gw, noPayment: true} })
		r, err := svc.CreateRefund(context.Background(), api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		after(t, b, s, r.Refund)
	})
	t.Run("another refund", func(t *testing.T) {
		t.Parallel()
		b := newBench(t)
		s := b.completed(t, "o-refund-other", 1000)
		b.gw.SetRefundOutcome("pending")
		r, err := b.svc.CreateRefund(context.Background(), api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "k"})
		if err != nil || r.Refund.GatewayRefundID == "" || r.Refund.Status != payments.RefundPending {
			t.Fatalf("refund = %+v %v, want Pending with the gateway's id", r.Refund, err)
		}
		svc := b.service(b.pool, "replica-other", func(c *payments.Config) { c.Gateway = refundGateway{Gateway: b.gw, otherRefund: true} })
		b.clock.Advance(time.Minute)
		if n, err := svc.DriveRefunds(context.Background()); err != nil || n != 1 {
			t.Fatalf("drive = %d %v", n, err)
		}
		got, err := b.svc.GetRefund(context.Background(), r.Refund.ID)
		if err != nil {
			t.Fatal(err)
		}
		after(t, b, s, got)
	})
}
