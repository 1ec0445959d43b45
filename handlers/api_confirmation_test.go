package handlers_test

import (
	"net/http"
	"testing"

	"pitlane/payments"
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
