package handlers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/payments"
)

// TestBrowserRowControlsNameTheirRow: a screen reader user tabbing through a table's actions
// heard the same name in every row: "Disable, button" on the users page, "Reject, button" on the
// resolutions page, "Resolve", "Retry now", "Check now", "Settle by hand…" on the finance pages,
// with nothing saying whose (WCAG 2.4.6, and 2.4.4 for the links: a row is not a link's
// context). Each control in a table row now names its row (out of sight: "Disable
// sup@example.com", "Reject proposal #2"), so no two rows of a table have a control of the same
// name. The names are read as a screen reader takes them (aria-label, else the text, hidden
// parts too, else the label or placeholder). Negative control: the pages as they were (no
// forRow, the rows' fields labelled alike) fail on every page.
func TestBrowserRowControlsNameTheirRow(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "adm@example.com", access.RoleAdmin)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.user(t, "sup@example.com", access.RoleSupport)
	bg := context.Background()
	fin := payments.Staff{Email: "fin@example.com", Role: string(access.RoleFinance)}
	for _, order := range []string{"o-rows-1", "o-rows-2"} {
		s := b.payment(t, order, 1000)
		b.flag(t, s.ID)
		if _, err := b.svc.ProposeResolution(bg, fin, payments.ProposalInput{SessionID: s.ID, Outcome: payments.StatusFailed,
			Reason: "never paid", Evidence: "gateway dashboard"}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(bg, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at)
			VALUES ($1, $2, 'gateway_mismatch', 'probe', $3)`, s.ID, s.OrderID, b.clock.Now()); err != nil {
			t.Fatal(err)
		}
		b.flaggedRefund(t, b.completed(t, order+"-paid", 2000), 500)
		b.payment(t, order+"-stuck", 700)
		b.clock.Advance(time.Second)
	}
	b.clock.Advance(payments.SettleWithin)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "adm@example.com")

	var alike []string
	for _, p := range []struct{ path, main string }{
		{"/admin/users", "users-table"},
		{"/finance/resolutions", "resolutions-title"},
		{"/finance/cases", "cases-table"},
		{"/finance/flagged", "flagged-table"},
		{"/finance/stuck", "stuck-table"},
	} {
		within(t, ctx, 20*time.Second, chromedp.Navigate(srv.URL+p.path), chromedp.WaitVisible(chromedp.CSS(testid(p.main))))
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
			const words = s => (s || "").replace(/\s+/g, " ").trim();
			const name = e => words(e.getAttribute("aria-label")) ||
				(/^(BUTTON|A)$/.test(e.tagName) ? words(e.textContent) : "") ||
				(e.labels && e.labels.length ? words(e.labels[0].textContent) : "") || words(e.getAttribute("placeholder"));
			const out = [];
			document.querySelectorAll("table").forEach(table => {
				const rows = new Map();
				table.querySelectorAll("tbody tr").forEach((tr, i) => {
					tr.querySelectorAll('a[href], button, select, textarea, input:not([type=hidden])').forEach(e => {
						const n = name(e);
						if (!rows.has(n)) rows.set(n, new Set());
						rows.get(n).add(i);
					});
				});
				rows.forEach((in_, n) => { if (in_.size > 1) out.push((table.getAttribute("data-testid") || "a table") + ": " + in_.size + " rows have " + JSON.stringify(n)); });
			});
			return out;
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			// Each page has two rows of each kind: the probe would have seen alike names.
			n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Math.min(...[...document.querySelectorAll("table")].filter(t => t.querySelector("tbody button, tbody textarea, tbody select")).map(t => t.querySelectorAll("tbody tr").length))`))
			if err != nil || n < 2 {
				t.Fatalf("%s: a table with controls has %d rows (%v): the probe shows nothing", p.path, n, err)
			}
		}
		for _, g := range got {
			alike = append(alike, p.path+": "+g)
		}
	}
	if len(alike) > 0 {
		t.Fatalf("controls in different rows of a table with the same name, which a screen reader cannot tell apart:\n%s", strings.Join(alike, "\n"))
	}
}
