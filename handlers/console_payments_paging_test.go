package handlers_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"

	"pitlane/access"
)

// TestPaymentsListPagesTiesAndRefusesAnUnknownCursor: the payments list pages through payments
// that share created_at (one clock tick) without skipping or repeating one, and a cursor that
// names no payment (an edited link, or a payment id of another database) is refused as such: it
// showed an empty list saying "No payments match." while payments did (an outside review).
func TestPaymentsListPagesTiesAndRefusesAnUnknownCursor(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	const n = 53
	for i := range n {
		b.payment(t, fmt.Sprintf("tie-%02d", i), 100)
	}
	sup := b.agent(t)
	sup.login("sup@example.com")
	seen := map[string]int{}
	path := "/payments?q=tie-"
	for pages := 0; path != "" && pages < 5; pages++ {
		doc := page(t, sup.get(path), http.StatusOK)
		for _, id := range doc.Find(testid("payment-row")).Map(func(_ int, s *goquery.Selection) string { return s.AttrOr("data-id", "") }) {
			seen[id]++
		}
		path, _ = doc.Find(testid("payments-next")).Attr("href")
	}
	if len(seen) != n {
		t.Errorf("paging showed %d distinct payments of %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("payment %s shown %d times", id, c)
		}
	}

	// A cursor that names no payment.
	rec := sup.get("/payments?before=" + uuid.NewString())
	if rec.Code == http.StatusOK {
		t.Fatalf("GET /payments?before=<no such payment> = 200 %q while %d payments exist; want a refusal naming the cursor",
			text(page(t, rec, http.StatusOK), "payments-empty"), n)
	}
	if rec.Code != http.StatusBadRequest && rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "first page") {
		t.Fatalf("GET /payments?before=<no such payment> = %d %q", rec.Code, rec.Body.String())
	}
}
