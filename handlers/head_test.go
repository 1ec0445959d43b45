package handlers_test

import (
	"io"
	"net/http"
	"testing"
)

// HEAD is answered wherever GET is (RFC 9110 §9.3.2): the GET's status and headers, no body.
// Load balancers and monitors probe with HEAD; before, every route answered 405.
func TestHeadIsAnsweredLikeGet(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	s := b.payment(t, "o-head", 1999)
	srv := b.server(t, b.e)
	for _, path := range []string{"/healthz", "/readyz", "/login", "/checkout/o-head", "/static/app.css", "/api/v1/payments/" + s.ID} {
		get, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, get.Body)
		get.Body.Close()
		head, err := http.Head(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(head.Body)
		head.Body.Close()
		if head.StatusCode != get.StatusCode || head.StatusCode == http.StatusMethodNotAllowed || len(body) != 0 ||
			head.Header.Get("Content-Type") != get.Header.Get("Content-Type") {
			t.Errorf("HEAD %s = %d %q (%d body bytes), GET = %d %q", path, head.StatusCode, head.Header.Get("Content-Type"), len(body),
				get.StatusCode, get.Header.Get("Content-Type"))
		}
	}
	// Nor where the GET writes: the outbox marks codes seen, the exports are audited. A HEAD
	// there would do it for a body nobody gets (an outside review).
	for _, path := range []string{"/outbox", "/finance/ledger.csv", "/admin/audit.csv"} {
		resp, err := http.Head(srv.URL + path)
		if err != nil || resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodGet {
			t.Errorf("HEAD %s = %v %v, want 405 with Allow: GET", path, resp, err)
		}
	}
	// A route with no GET still says which methods it has.
	if resp, err := http.Head(srv.URL + "/logout"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("HEAD /logout = %v %v, want 405", resp, err)
	}
}
