package handlers_test

import (
	"net/http"
	"testing"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A confirmation_url stored before GATEWAY_CONFIRMATION_HOSTS was narrowed is not handed to the
// shop (which sends its customers there) by a replica whose list leaves its host out: the API's
// payment object says null, on the payment and on the order. Without the check the API returned
// whatever the row held.
func TestAPIHidesAConfirmationURLOffTheHostList(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	b.gw.SetConfirmationURL("https://pages.old-gateway.example/p/1")
	created := wantPayment(t, b.do(post(createPath("o-hosts"), `{"amount":500,"currency":"EUR"}`)), http.StatusCreated)
	if created.ConfirmationURL == nil || *created.ConfirmationURL != "https://pages.old-gateway.example/p/1" {
		t.Fatalf("without a host list: confirmation_url %v", created.ConfirmationURL)
	}
	_, narrowed := b.server(t, b.pool, "replica-b", benchOpt{core: func(c *payments.Config) {
		c.ConfirmationHosts = []string{"hooks.stripe.com"}
	}})
	if p := wantPayment(t, b.on(narrowed, get("/api/v1/payments/"+created.ID)), http.StatusOK); p.ConfirmationURL != nil {
		t.Errorf("the payment on a replica listing other hosts: confirmation_url %q, want null", *p.ConfirmationURL)
	}
	rec := b.on(narrowed, get("/api/v1/orders/o-hosts"))
	order := decode[struct{ Payments []payment }](t, rec)
	if rec.Code != http.StatusOK || len(order.Payments) != 1 || order.Payments[0].ConfirmationURL != nil {
		t.Errorf("the order on a replica listing other hosts: %d %+v, want its payment without the URL", rec.Code, order.Payments)
	}
	if p := wantPayment(t, b.do(get("/api/v1/payments/"+created.ID)), http.StatusOK); p.ConfirmationURL == nil {
		t.Error("the replica without a list hides the URL too")
	}
}

// A cancel confirmed with the customer's code whose reverse has not gone
// through yet (Canceling: the gateway did not answer) must not hand the shop the gateway's
// payment page: the checkout page shows "being canceled" with no way to pay, and the API's
// payment object drops the link for a payment that is over, but still gives it for one the
// customer just asked to cancel — the shop sends the customer to pay money we are reversing.
// From the cancel flow review; negative control: without Canceling in paymentJSON's list, both
// answers carry the link.
func TestACancelingPaymentOffersNoConfirmationURL(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("o-canceling-url"), `{"amount":500,"currency":"USD","customer_contact":"c@example.com"}`)), http.StatusCreated)
	if p.ConfirmationURL == nil {
		t.Fatal("setup: no confirmation_url on the registered payment")
	}
	rec := b.do(post("/api/v1/payments/"+p.ID+"/cancel", ""))
	if rec.Code != http.StatusAccepted {
		t.Fatalf("cancel = %d %s", rec.Code, rec.Body)
	}
	ch := decode[struct {
		ChallengeID string `json:"challenge_id"`
	}](t, rec).ChallengeID
	b.gw.Fail(fakegw.OpReverse, fakegw.Transient, 1) // the reverse's answer does not come: Canceling
	got := wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/cancel/confirm",
		`{"challenge_id":"`+ch+`","code":"`+b.lastCode(t, p.ID)+`"}`)), http.StatusAccepted)
	if got.Status != "Canceling" {
		t.Fatalf("status = %s, want Canceling", got.Status)
	}
	if got.ConfirmationURL != nil {
		t.Errorf("confirm answer: a Canceling payment still offers confirmation_url %q", *got.ConfirmationURL)
	}
	again := wantPayment(t, b.do(get("/api/v1/payments/"+p.ID)), http.StatusOK)
	if again.ConfirmationURL != nil {
		t.Errorf("GET: a Canceling payment still offers confirmation_url %q", *again.ConfirmationURL)
	}
}
