package handlers_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The shop replaced a 7-day link at 100.00 with one at 150.00, then went back to 100.00 with a
// link for one minute. The price row held only the newest amount, so the first link — replaced,
// which "pays nothing from then on" (docs/api.md) — offered Pay again and its click registered a
// payment, also after the one-minute link had expired: for the rest of its own 7 days (a review
// of the checkout). A price change moves the price's generation on, and a link is signed with
// the generation it was made in. Negative controls: without the generation in payable's check
// the page offers Pay; without it in the claim (and checkoutStartAllowed) the form rendered
// before the round trip registers a payment.
func TestCheckoutLinkReplacedStaysReplacedWhenThePriceComesBack(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	ctx := context.Background()
	first := b.link(t, "o-back", 10000, "EUR")
	action, form := payForm(t, a, first) // rendered while the first link was current
	b.link(t, "o-back", 15000, "EUR")
	noPayForm(t, a, first, http.StatusConflict)
	short, err := b.svc.CheckoutLink(ctx, "o-back", 10000, "EUR", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if short.Generation != 2 {
		t.Fatalf("the third price's generation = %d, want 2", short.Generation)
	}
	wantText(t, noPayForm(t, a, first, http.StatusConflict), "checkout-replaced", "was replaced")
	page(t, a.post(action, form), http.StatusConflict)
	// A customer who moves the first link to the new generation edits what is signed.
	q, _ := url.ParseQuery(first[len(payments.CheckoutPath("o-back"))+1:])
	q.Set("gen", "2")
	noPayForm(t, a, payments.CheckoutPath("o-back")+"?"+q.Encode(), http.StatusBadRequest)
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("the replaced link started %d sessions, %d registrations", n, b.gw.Calls(fakegw.OpRegister))
	}
	b.clock.Advance(2 * time.Minute) // the shop's one-minute link is over: so is the price's
	noPayForm(t, a, first, http.StatusConflict)
	noPayForm(t, a, short.Path(), http.StatusGone)

	// A link of the current run pays; one more link at the same price is of the same run.
	again := b.link(t, "o-back", 10000, "EUR")
	action, form = payForm(t, a, again)
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("the current link's Pay: %d %s", rec.Code, rec.Body)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-back'`); n != 1 {
		t.Fatalf("sessions = %d, want the current link's one", n)
	}
}

// Links across a rolling deploy or a rollback, while replicas of the release before serve beside
// this one's (reviews of the generations: this release's links were refused by the release
// before's replicas, which check sig alone, and every link since was dead after a rollback; then,
// a link or Pay form without gen judged as generation 0 made the shop's current link "replaced"
// when an old replica had re-priced the order, or had rendered the form):
//   - a link's sig is the release before's signature (v2LinkPath computes it as that release
//     did), so its replicas take this release's links;
//   - a link or form without gen is judged by amount and currency alone, as before generations
//     (the release after this one judges it as generation 0);
//   - a replica of the release before that re-prices an order (its upsert knows no generation)
//     moves the generation all the same (the trigger of migration 01041): this release's links
//     of the run before are replaced, and the old replica's own link and forms work.
func TestCheckoutLinksAcrossARollingDeploy(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	ctx := context.Background()
	l, err := b.svc.CheckoutLink(ctx, "o-roll", 2500, "EUR", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustQuery(t, v2LinkPath(l)).Get("sig"); got != l.Sig {
		t.Fatalf("a link's sig %s is not the release before's signature %s: its replicas refuse the link", l.Sig, got)
	}
	current := l.Path()

	// An old replica re-prices the order (its statement, as it was) and hands the shop its link.
	oldReprice := func(amount int64) string {
		t.Helper()
		if _, err := b.pool.Exec(ctx, `INSERT INTO checkout_prices (order_id, amount, currency, priced_at, valid_until) VALUES ('o-roll', $1, 'EUR', $2, $3)
			ON CONFLICT (order_id) DO UPDATE SET amount = EXCLUDED.amount, currency = EXCLUDED.currency, priced_at = EXCLUDED.priced_at,
				valid_until = EXCLUDED.valid_until`, amount, b.clock.Now(), b.clock.Now().Add(24*time.Hour)); err != nil {
			t.Fatal(err)
		}
		return v2LinkPath(payments.CheckoutLink{OrderID: "o-roll", Amount: amount, Currency: "EUR", ExpiresAt: b.clock.Now().Add(24 * time.Hour).Truncate(time.Second)})
	}
	oldLink := oldReprice(3000)
	if gen := b.count(t, `SELECT generation FROM checkout_prices WHERE order_id = 'o-roll'`); gen != 1 {
		t.Fatalf("generation after the old replica's re-price = %d, want 1", gen)
	}
	noPayForm(t, a, current, http.StatusConflict) // replaced by the old replica's price
	payForm(t, a, oldLink)                        // the shop's current link, made by the old replica
	oldLink = oldReprice(2500)                    // and back: generation 2
	noPayForm(t, a, current, http.StatusConflict) // this release's link of generation 0 stays replaced

	// A Pay form as the old replica's page renders it (no gen: its template knew none), posted to
	// this release's replica: the payment starts — of the old replica's current link, and of
	// this release's.
	payFromAnOldPage := func(order, link string) {
		t.Helper()
		action, form := payForm(t, a, link)
		form.Del("gen")
		form.Del("gsig")
		if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
			t.Fatalf("Pay from an old replica's form of %s's current link: %d %s", order, rec.Code, rec.Body)
		}
		if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, order); n != 1 {
			t.Fatalf("%s: sessions = %d, want 1", order, n)
		}
	}
	payFromAnOldPage("o-roll", oldLink)
	b.link(t, "o-roll-form", 1200, "EUR")
	payFromAnOldPage("o-roll-form", b.link(t, "o-roll-form", 1500, "EUR"))
}

// v2LinkPath is l as the release before generations made it: HMAC-SHA256 under the link key of
// "checkout-link/v2" 0 order 0 amount 0 currency 0 exp, computed here as that release did, and no
// gen or gsig in the query.
func v2LinkPath(l payments.CheckoutLink) string {
	key := hmac.New(sha256.New, []byte("test-secret"))
	key.Write([]byte("pitlane checkout-link key v1"))
	m := hmac.New(sha256.New, key.Sum(nil))
	m.Write([]byte("checkout-link/v2\x00" + l.OrderID + "\x00" + strconv.FormatInt(l.Amount, 10) + "\x00" + l.Currency + "\x00" +
		strconv.FormatInt(l.ExpiresAt.Unix(), 10)))
	q := url.Values{}
	q.Set("amount", strconv.FormatInt(l.Amount, 10))
	q.Set("currency", l.Currency)
	q.Set("exp", strconv.FormatInt(l.ExpiresAt.Unix(), 10))
	q.Set("sig", hex.EncodeToString(m.Sum(nil)))
	return payments.CheckoutPath(l.OrderID) + "?" + q.Encode()
}
