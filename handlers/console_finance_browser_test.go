package handlers_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Chromium on the finance pages: the workbench's bulk "Check now" double-clicked while the
// gateway is slow, and four-eyes resolution by two people. Each page added is photographed into
// .pitlane/screenshots/ (gitignored; a test artifact, docs/console.md names them).

// screenshotDir is .pitlane/screenshots at the repository's root (tests run in handlers/).
const screenshotDir = "../.pitlane/screenshots"

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	// Bounded: a page that navigates during the capture (a reload) can leave it waiting for
	// ever, and the whole package with it.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(screenshotDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(screenshotDir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// browserLogin signs in through the sign-in page.
func browserLogin(t *testing.T, ctx context.Context, base, email string) {
	t.Helper()
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(base+"/login"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="login-form"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="login-email"]`), email),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="login-password"]`), testPassword),
		liveClick(chromedp.CSS(`[data-testid="login-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="whoami"]`)),
	)
}

// browserText is the visible text of the element with the data-testid. It reads in one
// JavaScript evaluation: a live refresh may swap the element's region in between
// the separate DevTools calls of a query and a read ("No node with given id"), never inside one
// script. It waits up to 10 s for the element to exist.
func browserText(t *testing.T, ctx context.Context, testid string) string {
	t.Helper()
	got, err := chromedp.Run(ctx, chromedp.Poll[[]string](`(() => {
		const e = document.querySelector('[data-testid="`+testid+`"]');
		return e ? [e.innerText.trim()] : null;
	})()`, chromedp.WithPollingTimeout(10*time.Second)))
	if err != nil || len(got) != 1 {
		t.Fatalf("text of %s: %v", testid, err)
	}
	return got[0]
}

// typeInto types text into the input with the data-testid as a keyboard does (focus, then key
// events), and checks that the input holds it. On a live page a refresh may swap the region
// between chromedp's query of a node and its keystrokes (a SendKeys then waits on a node that is
// gone until its deadline): here the element is found and focused in one JavaScript evaluation,
// the keys go to whatever has the focus, and a swap in between is seen on the value and typed
// again, up to three times.
func typeInto(t *testing.T, ctx context.Context, testid, text string) {
	t.Helper()
	focus := `(() => {
		const e = document.querySelector('[data-testid="` + testid + `"]');
		if (!e) return false;
		e.value = ""; e.focus();
		return document.activeElement === e;
	})()`
	value := `(() => {
		const e = document.querySelector('[data-testid="` + testid + `"]');
		return e ? e.value : "";
	})()`
	for range 3 {
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](focus, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
			t.Fatalf("focus %s: %v", testid, err)
		}
		within(t, ctx, 10*time.Second, chromedp.KeyEvent(text))
		if got, err := chromedp.Run(ctx, chromedp.Evaluate[string](value)); err == nil && got == text {
			return
		}
	}
	t.Fatalf("could not type into %s: the page kept swapping it", testid)
}

// TestBrowserWorkbenchBulkCheck: finance ticks every stuck payment ("select all") and
// double-clicks "Check selected now" while the gateway holds the first click's calls. Two POSTs
// reach the server; the second asks the gateway nothing and says who is checking; the first
// finishes after the browser dropped it. One status call per payment, each Completed once.
func TestBrowserWorkbenchBulkCheck(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	var sessions []payments.Session
	for _, o := range []string{"o-stuck-1", "o-stuck-2", "o-stuck-3"} {
		s := b.payment(t, o, 2500)
		b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
		sessions = append(sessions, s)
		b.clock.Advance(time.Minute)
	}
	b.clock.Advance(payments.SettleWithin)
	counter := &posts{h: b.e, prefix: "/finance/stuck/check", done: make(chan int, 10)}
	srv := b.server(t, counter)

	ctx := newBrowser(t)
	within(t, ctx, 10*time.Second, chromedp.EmulateViewport(1280, 900)) // a desk's screen, for the pictures
	browserLogin(t, ctx, srv.URL, "fin@example.com")
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+"/finance/stuck"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="stuck-table"]`)),
	)
	screenshot(t, ctx, "finance-stuck.png")
	within(t, ctx, 10*time.Second, liveClick(chromedp.CSS(`[data-testid="stuck-select-all"]`)))
	ticked, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="stuck-select"]:checked').length`))
	if err != nil || ticked != 3 {
		t.Fatalf("select all ticked %d rows (%v)", ticked, err)
	}
	click := handClick(t, ctx, "stuck-check-selected")

	gate := b.gw.Hold(fakegw.OpStatus)
	defer gate.Open()
	click(1)
	mustWaitC(t, gate.Arrived(), "the first click's check at the gateway")
	click(2)
	if st := mustWaitC(t, counter.done, "the second click's POST"); st != http.StatusSeeOther {
		t.Fatalf("second POST answered %d", st)
	}
	within(t, ctx, 20*time.Second, chromedp.WaitVisible(chromedp.CSS(`[data-testid="flash"]`)))
	if msg := browserText(t, ctx, "flash"); !strings.Contains(msg, "Checked 0, skipped 3") || !strings.Contains(msg, "being checked by fin@example.com") {
		t.Fatalf("second click's message: %q", msg)
	}
	gate.Open()
	mustWaitC(t, counter.done, "the first click's POST (dropped by the browser, finished by the server)")
	if n := counter.arrived.Load(); n != 2 {
		t.Fatalf("%d POSTs, want 2 (the double click)", n)
	}
	for _, s := range sessions {
		if n := b.gw.PaymentCalls(fakegw.OpStatus, s.GatewayPaymentID); n != 1 {
			t.Errorf("payment %s: %d status calls, want 1", s.OrderID, n)
		}
		if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, s.ID); n != 1 {
			t.Errorf("payment %s: %d ledger entries", s.OrderID, n)
		}
	}
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+"/finance/stuck"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="stuck-none"]`)),
	)
}

// TestBrowserFourEyesResolution: one finance user proposes "Completed" for a flagged payment
// from the workbench, is refused when approving it themself, signs out; an admin approves: the
// payment is Completed with one ledger entry. Also photographs the resolution pages and the
// ledger.
func TestBrowserFourEyesResolution(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.user(t, "adm@example.com", access.RoleAdmin)
	s := b.payment(t, "o-by-hand", 4200)
	if _, err := b.pool.Exec(context.Background(), `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'schedule ran out',
		next_check_at = NULL, check_attempts = 17 WHERE id = $1`, s.ID, consoleT0); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(payments.SettleWithin)
	srv := b.server(t, b.e)

	ctx := newBrowser(t)
	within(t, ctx, 10*time.Second, chromedp.EmulateViewport(1280, 900)) // a desk's screen, for the pictures
	browserLogin(t, ctx, srv.URL, "fin@example.com")
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+"/finance/stuck"),
		liveClick(chromedp.CSS(`[data-testid="stuck-row"][data-id="`+s.ID+`"] [data-testid="stuck-propose"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="propose-form"]`)),
		liveClick(chromedp.CSS(`[data-testid="propose-outcome-Completed"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="propose-reason"]`), "the gateway's dashboard shows it captured"),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="propose-evidence"]`), "gateway dashboard export, ticket FIN-12"),
	)
	screenshot(t, ctx, "finance-propose.png")
	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="propose-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="resolutions-pending"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="resolution-own"]`)),
	)
	// The proposer's own approval: refused, with the reason on the page; nothing changed.
	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="approve"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="flash-error"]`)),
	)
	if msg := browserText(t, ctx, "flash-error"); !strings.Contains(msg, "a second finance or admin user must approve it") {
		t.Fatalf("self-approval message: %q", msg)
	}
	screenshot(t, ctx, "finance-resolutions.png")
	if cur, _ := b.svc.Get(context.Background(), s.ID); cur.Status != payments.StatusRegistered {
		t.Fatalf("the self-approval changed the payment: %s", cur.Status)
	}

	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="logout"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="login-form"]`)),
	)
	browserLogin(t, ctx, srv.URL, "adm@example.com")
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+"/finance/resolutions"),
		liveClick(chromedp.CSS(`[data-testid="approve"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="flash"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="resolutions-decided"]`)),
	)
	if msg := browserText(t, ctx, "flash"); !strings.Contains(msg, "is Completed") {
		t.Fatalf("approval message: %q", msg)
	}
	screenshot(t, ctx, "finance-resolutions-approved.png")
	if cur, _ := b.svc.Get(context.Background(), s.ID); cur.Status != payments.StatusCompleted {
		t.Fatalf("after approval: %s", cur.Status)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1 AND entry_type = 'PaymentReceived'`, s.ID); n != 1 {
		t.Fatalf("%d PaymentReceived entries, want 1", n)
	}
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+"/finance/ledger"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="ledger-totals"]`)),
	)
	screenshot(t, ctx, "finance-ledger.png")
}
