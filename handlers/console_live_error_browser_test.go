package handlers_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"pitlane/access"
)

// Review of session 32's own commits (b988132; fixed in the commit that brought this test):
// static/app.js's htmx:beforeSwap handler acted on every htmx request
// with an error answer, live.js's own region refreshes too (htmx.ajax, elt = body: no hx-select,
// so "any other answer replaces the page's main"). A database blip while a payment page is open
// (the stream goes down, the page polls, one poll is answered 503) replaces the page with the
// error page; the live region is gone, so nothing ever refreshes it again: once the database is
// back the operator still looks at "503" until they reload by hand. Before the handler a failed
// refresh changed nothing and the next one brought the page back (docs/console.md: the region
// polls while the stream is down).
func TestBrowserALiveRefreshThatFailsKeepsThePage(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, "o-live-blip", 1500)
	var db string
	if err := b.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int32
	refused := make(chan struct{}, 1)
	srv := b.server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		b.e.ServeHTTP(rec, r)
		if r.Header.Get("X-Pitlane-Live") == "1" && rec.status >= 400 {
			failed.Add(1)
			select {
			case refused <- struct{}{}:
			default:
			}
		}
	}))
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/payments/"+s.ID)
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Registered")

	restore := outage(t, db)
	select {
	case <-refused: // the page polled and one refresh was answered with an error
	case <-time.After(30 * time.Second):
		restore()
		t.Fatal("no live refresh was answered with an error during the outage")
	}
	restore()
	waitJS(t, ctx, "the payment page, live again after the database came back",
		`document.documentElement.getAttribute("data-live-state") === "live" && !!document.querySelector('[data-testid="payment-status"]')`)
	noReload(t, ctx)
}
