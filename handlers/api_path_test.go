package handlers_test

import (
	"net/http"
	"testing"
)

// A path parameter is decoded once. The router decodes a path whose escaping is the default
// one itself (Go keeps no RawPath for it), and the handlers decoded it again: an API client whose
// order id "o%41" (a '%': invalid) it escaped as it must, o%2541, had a payment created for order
// "oA" instead of a 422 (an outside review, hostile input). A path the router takes raw (an
// escape Go would not write, %2E) is still decoded once: "a%2Eb" is order "a.b". The checkout
// page reads its order the same way. Negative control: PathParam decoding always, the first
// create answers 201 for order "oA".
func TestAPathParameterIsDecodedOnce(t *testing.T) {
	t.Parallel()
	api := newAPIBench(t)
	body := `{"amount":100,"currency":"EUR"}`
	if rec := api.do(post(createPath("o%2541"), body)); rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("create for order id \"o%%41\" = %d, want 422; body:\n%s", rec.Code, rec.Body)
	}
	if n := api.count(t, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders written by a refused create", n)
	}
	rec := api.do(post(createPath("a%2Eb"), body))
	if p := decode[payment](t, rec); rec.Code != http.StatusCreated || p.OrderID != "a.b" {
		t.Fatalf("create for a%%2Eb = %d, order %q; want 201 for order a.b", rec.Code, p.OrderID)
	}
	if rec := api.do(get("/api/v1/orders/a%252Eb")); rec.Code != http.StatusUnprocessableEntity && rec.Code != http.StatusNotFound {
		t.Fatalf("order a%%252Eb (the id \"a%%2Eb\") = %d, want a refusal, not order a.b", rec.Code)
	}
}
