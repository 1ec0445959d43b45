package handlers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/payments"
)

// Two proposals wait with the same outcome, so their Approve buttons are alike (data-testid
// "approve", the same text). A finance user has tabbed to the second one's Approve when a third
// proposal arrives and the page refreshes itself: refocus put the focus on the first one's, and
// Enter approved the other payment's proposal (a review of the change). The focus is looked for
// in its own row. Negative control: refocus without the row (key.scope) — as long as the buttons'
// text is alike too; since each names its proposal out of sight (forRow, "Approve: mark Failed
// proposal #2"), the text alone tells them apart as well, and the row scope is the guard for
// controls that do not name their row.
func TestBrowserLiveRefreshKeepsTheFocusInItsRow(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.user(t, "fin2@example.com", access.RoleFinance)
	bg := context.Background()
	fin := payments.Staff{Email: "fin@example.com", Role: string(access.RoleFinance)}
	propose := func(order string) int64 {
		s := b.payment(t, order, 1000)
		b.flag(t, s.ID)
		r, err := b.svc.ProposeResolution(bg, fin, payments.ProposalInput{SessionID: s.ID, Outcome: payments.StatusFailed,
			Reason: "never paid", Evidence: "gateway dashboard"})
		if err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(time.Second)
		return r.ID
	}
	first := propose("o-focus-1")
	second := propose("o-focus-2")
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "fin2@example.com")
	openLive(t, ctx, srv.URL+"/finance/resolutions")
	tabUntil(t, ctx, "the second proposal's Approve", fmt.Sprintf(
		`document.activeElement.getAttribute("data-testid") === "approve" && document.activeElement.closest("tr").getAttribute("data-id") === "%d"`, second))
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		window.liveSwaps = 0;
		document.addEventListener("htmx:afterSwap", e => { if ((e.detail.requestConfig.headers || {})["X-Pitlane-Live"] === "1") window.liveSwaps++; });
		return true; })()`)); err != nil {
		t.Fatal(err)
	}
	third := propose("o-focus-3")
	waitJS(t, ctx, "the live refresh with the third proposal", fmt.Sprintf(`window.liveSwaps >= 1 && !!document.querySelector('[data-testid="resolution-row"][data-id="%d"]')`, third))
	noReload(t, ctx)
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const e = document.activeElement; const tr = e.closest("tr");
		return e.tagName + " " + (e.getAttribute("data-testid") || "") + " row " + (tr ? tr.getAttribute("data-id") : "-"); })()`))
	if err != nil {
		t.Fatal(err)
	}
	if got == fmt.Sprintf("BUTTON approve row %d", first) {
		t.Fatalf("after the live refresh the keyboard focus is on proposal #%d's Approve; the user was on #%d's: Enter now approves the wrong proposal", first, second)
	}
	if want := fmt.Sprintf("BUTTON approve row %d", second); got != want {
		t.Fatalf("after the live refresh the keyboard focus is on %q, want %q", got, want)
	}
}

// At 320 CSS px (400 % zoom) the leases table scrolls inside its own region; a reader who
// scrolled it sideways to read the right-hand columns was thrown back to its start by the page's
// 10-second refresh (a review of the change that wrapped the tables). Negative control: live.js
// without keepScrolled.
func TestBrowserLiveRefreshKeepsATableScrolledSideways(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, "o-live-lease-scroll", 1000)
	b.exec(t, `UPDATE payment_sessions SET lease_owner = 'replica-a', lease_until = $2, lease_token = gen_random_uuid() WHERE id = $1`,
		s.ID, b.clock.Now().Add(time.Hour))
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	within(t, ctx, 10*time.Second, chromedp.EmulateViewport(320, 800))
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/locks")
	region := `document.querySelector('[data-testid="leases-table"]').closest(".table-scroll")`
	before, err := chromedp.Run(ctx, chromedp.Evaluate[int](`(() => { const r = `+region+`;
		window.swaps = 0; document.addEventListener("htmx:afterSwap", () => { window.swaps++; });
		r.scrollLeft = r.scrollWidth; return Math.round(r.scrollLeft); })()`))
	if err != nil || before <= 0 {
		t.Fatalf("the leases table does not scroll sideways at 320 px (scrollLeft %d, %v): the probe shows nothing", before, err)
	}
	waitJS(t, ctx, "the page's 10-second refresh", `window.swaps >= 1`)
	noReload(t, ctx)
	after, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Math.round(`+region+`.scrollLeft)`))
	if err != nil || after != before {
		t.Fatalf("after the locks page's timed refresh (nothing changed) the leases table is scrolled to %d, was %d (%v): the reader is thrown back to its first columns every 10 s", after, before, err)
	}
}

// The finance cases page's rows carried data-case only, no id or data-id, so refocus had no row
// scope there: two open cases' Resolve buttons are alike, nothing matched for sure, and the focus
// on the second one's Resolve was thrown to the page's body at every live refresh (a review of
// 0700bc6). Negative control: the case rows without data-id.
func TestBrowserLiveRefreshKeepsTheFocusOnACaseRowsResolve(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	bg := context.Background()
	openCase := func(order string) int64 {
		s := b.payment(t, order, 1000)
		var id int64
		if err := b.pool.QueryRow(bg, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at)
			VALUES ($1, $2, 'gateway_mismatch', 'probe', $3) RETURNING id`, s.ID, s.OrderID, b.clock.Now()).Scan(&id); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(time.Second)
		return id
	}
	first := openCase("o-case-focus-1")
	second := openCase("o-case-focus-2")
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "fin@example.com")
	openLive(t, ctx, srv.URL+"/finance/cases")
	tabUntil(t, ctx, "the second case's Resolve", fmt.Sprintf(
		`document.activeElement.getAttribute("data-testid") === "resolve-submit" && document.activeElement.closest("tr").getAttribute("data-case") === "%d"`, second))
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		window.liveSwaps = 0;
		document.addEventListener("htmx:afterSwap", e => { if ((e.detail.requestConfig.headers || {})["X-Pitlane-Live"] === "1") window.liveSwaps++; });
		return true; })()`)); err != nil {
		t.Fatal(err)
	}
	third := openCase("o-case-focus-3")
	waitJS(t, ctx, "the live refresh with the third case", fmt.Sprintf(`window.liveSwaps >= 1 && !!document.querySelector('[data-testid="case-row"][data-case="%d"]')`, third))
	noReload(t, ctx)
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const e = document.activeElement; const tr = e.closest("tr");
		return e.tagName + " " + (e.getAttribute("data-testid") || "") + " row " + (tr ? tr.getAttribute("data-case") : "-"); })()`))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("BUTTON resolve-submit row %d", second); got != want {
		t.Fatalf("after the live refresh the keyboard focus is on %q, want %q (case #%d's Resolve; #%d is the other)", got, want, second, first)
	}
}
