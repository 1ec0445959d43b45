package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
)

// The demo orders `pitlane dev` seeds on first start, one per state worth looking at. Each is
// created only when its order does not exist yet, so seeding is idempotent (a restart, or a start
// interrupted half way, seeds what is missing and nothing twice).
const (
	demoWaiting   = "demo-1001" // Registered: waiting for the customer on the hosted page
	demoCompleted = "demo-1002" // Completed, with its PaymentReceived ledger entry, and 10.00 of it refunded
	demoFailed    = "demo-1003" // Failed: the customer declined
	demoCanceled  = "demo-1004" // Canceled with a one-time code, reversed at the gateway
	demoUnknown   = "demo-1005" // Unknown: the register answer was lost; the sweeper resolves it
)

// demoRefund is how much of demoCompleted is refunded (minor units).
const demoRefund = 1000

var demoOrders = []string{demoWaiting, demoCompleted, demoFailed, demoCanceled, demoUnknown}

// demoActor is who the demo's timeline events name.
var demoActor = payments.Actor{Kind: payments.ActorSystem, ID: "dev-demo"}

// seedDemo creates the demo orders that do not exist yet, driving the simulator where a
// customer or the gateway would act. It returns how many orders it created.
func seedDemo(ctx context.Context, cfg config.Config, svc *payments.Service, sim *gatewaysim.Sim) (int, error) {
	created := 0
	for _, id := range demoOrders {
		_, _, err := svc.GetOrder(ctx, id)
		if err == nil {
			continue
		}
		if payments.ErrorCode(err) != payments.ENOTFOUND {
			return created, fmt.Errorf("demo: %w", err)
		}
		if err := seedDemoOrder(ctx, cfg, svc, sim, id); err != nil {
			return created, fmt.Errorf("demo order %s: %w", id, err)
		}
		created++
	}
	return created, nil
}

func seedDemoOrder(ctx context.Context, cfg config.Config, svc *payments.Service, sim *gatewaysim.Sim, id string) error {
	in := payments.CreateInput{OrderID: id, Currency: "EUR", CustomerContact: "customer+" + id + "@example.com"}
	switch id {
	case demoWaiting:
		in.Amount = 1999
		_, err := svc.Create(ctx, demoActor, in)
		return err

	case demoCompleted:
		in.Amount = 4250
		res, err := svc.Create(ctx, demoActor, in)
		if err != nil {
			return err
		}
		if _, err := sim.Succeed(res.Session.GatewayPaymentID); err != nil {
			return err
		}
		if _, err = svc.Check(ctx, demoActor, res.Session.ID); err != nil {
			return err
		}
		// A partial refund: its RefundIssued entry, its events in the feed, the refunds table.
		_, err = svc.CreateRefund(ctx, demoActor, payments.RefundInput{PaymentID: res.Session.ID, Amount: demoRefund, RequestKey: "demo"})
		return err

	case demoFailed:
		in.Amount = 990
		res, err := svc.Create(ctx, demoActor, in)
		if err != nil {
			return err
		}
		if _, err := sim.Decline(res.Session.GatewayPaymentID, "insufficient_funds"); err != nil {
			return err
		}
		_, err = svc.Check(ctx, demoActor, res.Session.ID)
		return err

	case demoCanceled:
		in.Amount = 15000
		res, err := svc.Create(ctx, demoActor, in)
		if err != nil {
			return err
		}
		// The code goes to the customer; here a service sharing everything but the notifier
		// reads it from the message, as the customer would read it out to support.
		codes := &codeCatcher{}
		seedSvc := payments.NewService(svc.DB(), payments.Config{Clock: svc, Gateway: svc.Gateway(), ReplicaID: cfg.ReplicaID,
			CodeSecret: cfg.SecretKey, ReturnURL: returnURL(cfg.PublicBaseURL), GatewayURL: cfg.GatewayURL, ConfirmationHosts: cfg.ConfirmationHosts, Notifier: codes})
		ch, err := seedSvc.RequestCancel(ctx, demoActor, res.Session.ID)
		if err != nil {
			return err
		}
		code, ok := codes.code()
		if !ok {
			return errors.New("the cancel code message carried no code")
		}
		_, err = seedSvc.ConfirmCancel(ctx, demoActor, res.Session.ID, ch.ID, code)
		return err

	case demoUnknown:
		in.Amount = 3100
		// The gateway registers the payment and the answer is lost on the way back.
		sim.DropNext(gatewaysim.OpRegister, 1)
		_, err := svc.Create(ctx, demoActor, in)
		return err
	}
	return fmt.Errorf("no recipe for demo order %s", id)
}

// codeCatcher is a Notifier that keeps the last message.
type codeCatcher struct {
	mu   sync.Mutex
	text string
}

var sixDigits = regexp.MustCompile(`\b\d{6}\b`)

func (c *codeCatcher) Notify(_ context.Context, m payments.Message) error {
	c.mu.Lock()
	c.text = m.Text
	c.mu.Unlock()
	return nil
}

func (c *codeCatcher) code() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	code := sixDigits.FindString(c.text)
	return code, code != ""
}

// printDemo writes one line per demo order as it is now.
func printDemo(ctx context.Context, w io.Writer, svc *payments.Service) {
	for _, id := range demoOrders {
		o, sessions, err := svc.GetOrder(ctx, id)
		if err != nil {
			fmt.Fprintf(w, "    %-10s (missing: %s)\n", id, payments.ErrorMessage(err))
			continue
		}
		if len(sessions) == 0 {
			fmt.Fprintf(w, "    %-10s %s, no payment\n", id, o.Status)
			continue
		}
		s := sessions[len(sessions)-1]
		var note []string
		switch s.Status {
		case payments.StatusRegistered:
			note = append(note, "pay at "+s.ConfirmationURL)
		case payments.StatusCompleted:
			note = append(note, "ledger: PaymentReceived")
			refunds, _, _ := svc.RefundsOf(ctx, s.ID)
			for _, r := range refunds {
				note = append(note, "refund "+minor(r.Amount)+" "+r.Status)
			}
		case payments.StatusUnknown, payments.StatusRegistering:
			note = append(note, "the sweeper settles it within seconds")
		}
		fmt.Fprintf(w, "    %-10s %-11s %7s %s  payment %s  %s\n", id, s.Status, minor(s.Amount), s.Currency, s.ID, strings.Join(note, "; "))
	}
}

// The banner's signed checkout link is for a fresh order: the first of demo-2001, demo-2002, …
// that pitlane has not seen (one paid or tried in an earlier run is passed over), 25.00 EUR. It
// is what a shop gets from POST /api/v1/orders/{order_id}/checkout-links; making it writes
// nothing.
const (
	demoLinkFirst    = 2001
	demoLinkLast     = 2099
	demoLinkAmount   = 2500
	demoLinkCurrency = "EUR"
)

// printCheckoutLink writes the demo checkout link, or why there is none.
func printCheckoutLink(ctx context.Context, w io.Writer, svc *payments.Service) {
	for n := demoLinkFirst; n <= demoLinkLast; n++ {
		id := fmt.Sprintf("demo-%d", n)
		_, _, err := svc.GetOrder(ctx, id)
		if err == nil {
			continue
		}
		if payments.ErrorCode(err) != payments.ENOTFOUND {
			fmt.Fprintf(w, "  checkout link: failed: %s\n", oneLine(payments.ErrorMessage(err)))
			return
		}
		l, err := svc.CheckoutLink(ctx, id, demoLinkAmount, demoLinkCurrency, 0) // the default lifetime
		if err != nil {
			fmt.Fprintf(w, "  checkout link: failed: %s\n", oneLine(payments.ErrorMessage(err)))
			return
		}
		fmt.Fprintf(w, "  checkout link (signed, valid until %s; the customer's page of a fresh order %s, %s %s):\n    %s\n",
			l.ExpiresAt.UTC().Format(time.DateOnly), id, minor(demoLinkAmount), demoLinkCurrency, svc.CheckoutURL(l))
		return
	}
	fmt.Fprintf(w, "  checkout link: demo-%d…demo-%d all have payments; make one with POST /api/v1/orders/{order_id}/checkout-links\n",
		demoLinkFirst, demoLinkLast)
}

func minor(amount int64) string { return fmt.Sprintf("%d.%02d", amount/100, amount%100) }

// demoStaff are the console logins `pitlane dev` creates and prints: one per role. They exist
// only in dev's private database (or one named with --demo); serve never creates users
// (pitlane user create does).
var demoStaff = []struct {
	email    string
	role     access.Role
	password string
}{
	{"support@pitlane.dev", access.RoleSupport, "support-demo-pass"},
	{"finance@pitlane.dev", access.RoleFinance, "finance-demo-pass"},
	{"admin@pitlane.dev", access.RoleAdmin, "admin-demo-pass"},
}

// seedStaff creates the demo logins that do not exist yet (an existing user keeps its password)
// and returns what the banner prints for each: its password while it still signs in with it, or
// why it is not shown (a changed password, a disabled login, another role).
func seedStaff(ctx context.Context, acc *access.Service) ([]string, error) {
	lines := make([]string, 0, len(demoStaff))
	for _, u := range demoStaff {
		if _, err := acc.EnsureUser(ctx, payments.Staff{Email: "dev-demo"}, u.email, u.role, u.password); err != nil {
			return nil, fmt.Errorf("demo login %s: %w", u.email, err)
		}
		ok, err := acc.SignsInWith(ctx, u.email, u.password)
		if err != nil {
			return nil, fmt.Errorf("demo login %s: %w", u.email, err)
		}
		cur, err := acc.User(ctx, u.email)
		switch {
		case err != nil:
			return nil, fmt.Errorf("demo login %s: %w", u.email, err)
		case cur.Disabled():
			lines = append(lines, fmt.Sprintf("%-8s %s (disabled)", u.role, u.email))
		case !ok:
			lines = append(lines, fmt.Sprintf("%-8s %s (its password was changed: not the demo one)", cur.Role, u.email))
		default:
			lines = append(lines, fmt.Sprintf("%-8s %s / %s", cur.Role, u.email, u.password))
		}
	}
	return lines, nil
}

// printStaff writes the demo logins (seedStaff's lines).
func printStaff(w io.Writer, lines []string) {
	fmt.Fprintf(w, "  demo staff logins (password after the slash):\n")
	for _, l := range lines {
		fmt.Fprintf(w, "    %s\n", l)
	}
}
