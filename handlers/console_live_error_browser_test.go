package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/handlers"
	"pitlane/payments"
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

// The stream says "refresh", the page's fetch of its region fails once (a 503: the request's
// bound on a database that stalled a moment, a replica going away), and the page still comes to
// read the change. Before, live.js took a failed fetch as done: the stream's position had moved
// past the change (a reconnect's Last-Event-ID says nothing was missed), and for a payment in a
// final state no later event comes, so support kept reading "Registered" for a payment the
// customer paid (an outside review, live). Negative control: without live.js's afterRequest
// listener the wait for Completed times out.
func TestBrowserALiveRefreshThatFailsIsFetchedAgain(t *testing.T) {
	b, paid, live, ctx := failingLivePage(t, "o-refresh-fails", http.StatusServiceUnavailable, true)

	live.arm() // the next live refresh of a region answers 503, once
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, paid.ID); err != nil {
		t.Fatal(err)
	}
	mustWaitC(t, live.seen, "the one failed live refresh")
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Completed")
}

// A live refresh whose answer stays an error (a 403 after the user's role changed, a page that
// answers 500 for a bug, a long 503) is asked for again by one retry at a time, each waiting
// twice as long: the first retry (2679629) armed a new 2 s retry after every failed fetch, and
// every trigger while the region was behind (a click's focusout, a stream event, the tab shown
// again) started a fetch and so one more chain, for ever (the session's own review: 23 requests
// in 6 s from one tab after 8 triggers). Here the stream announces one change (the first failed
// fetch), then 7 clicks within 1.75 s each fetch once (and fail); the 6 s after them are
// counted: a rate over a window, not a wait for an event. Negative control: live.js of 2679629,
// 23 in the window.
func TestBrowserALiveRefreshThatKeepsFailingBacksOff(t *testing.T) {
	b, s, live, ctx := failingLivePage(t, "o-live-retry-chains", http.StatusForbidden, false)

	live.arm()
	// The first failed refresh: the stream announces a change of the payment (a Check writes its
	// gateway call), the region is fetched and answered 403; live.js marks the region behind.
	if _, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	mustWaitC(t, live.seen, "the first failed live refresh")
	// Then 7 focus changes spread over the next 1.75 s (a person clicking about the page: each
	// click blurs what had focus; live.js refreshes on focusout while the region is behind). The
	// browser itself spaces them (setTimeout in the page), as a person would.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`for (let i = 1; i <= 7; i++) {
			setTimeout(() => {
				document.body.dispatchEvent(new FocusEvent("focusout", {bubbles: true}));
				if (i === 7) { window.clicksDone = true; }
			}, i * 250);
		}; true`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the 7 clicks", `window.clicksDone === true`)
	// drain what already came, then count a window
	for len(live.seen) > 0 {
		<-live.seen
	}
	c0 := live.count()
	<-time.After(6 * time.Second) // a rate is measured over a window: nothing to wait for
	n := live.count() - c0
	if n > 4 {
		t.Fatalf("%d live refreshes answered 403 in 6 s from one tab: the failed refresh's retry chains multiplied (one chain makes at most 4)", n)
	}
}

// failingLive serves the bench's console and, once armed, answers the page's live refreshes
// (X-Pitlane-Live) with status: the first one only when once, every one otherwise. seen gets a
// value for each refresh it failed.
type failingLive struct {
	srv         *httptest.Server
	seen        chan struct{}
	mu          sync.Mutex
	armed, once bool
	fails       int
}

// failingLivePage is a support user's browser on the live page of a new Registered payment of
// order, served by a failingLive.
func failingLivePage(t *testing.T, order string, status int, once bool) (*consoleBench, payments.Session, *failingLive, context.Context) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, order, 1500)
	live := newFailingLive(t, b, status, once)
	ctx := newBrowser(t)
	browserLogin(t, ctx, live.srv.URL, "sup@example.com")
	openLive(t, ctx, live.srv.URL+"/payments/"+s.ID)
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Registered")
	return b, s, live, ctx
}

func newFailingLive(t *testing.T, b *consoleBench, status int, once bool) *failingLive {
	f := &failingLive{seen: make(chan struct{}, 1000), once: once}
	f.srv = b.server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		fail := f.armed && r.Header.Get(handlers.LiveHeader) == "1"
		if fail {
			f.fails++
			f.armed = !f.once
		}
		f.mu.Unlock()
		if !fail {
			b.e.ServeHTTP(w, r)
			return
		}
		http.Error(w, http.StatusText(status), status)
		f.seen <- struct{}{}
	}))
	return f
}

func (f *failingLive) arm() { f.mu.Lock(); f.armed = true; f.mu.Unlock() }

func (f *failingLive) count() int { f.mu.Lock(); defer f.mu.Unlock(); return f.fails }

// The stream announces a change and the region's fetch fails; the stream drops and the page
// polls, and the polls fail too (no retry timer while polling); then the stream opens again from
// the last event id, past the change, and polling stops: the region, behind, is fetched at once.
// Before, nothing fetched it again, and support read "Registered" for a paid payment until they
// clicked about (the session's own review). Negative control: without onopen's catch-up, the wait
// for Completed times out.
func TestBrowserAFailedRefreshIsFetchedOnceTheStreamReopens(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	paid := b.payment(t, "o-live-reopen", 1999)
	var (
		mu           sync.Mutex
		failLive     bool
		refuseStream bool
		cancelStream context.CancelFunc
		failed       = make(chan struct{}, 1000)
	)
	srv := b.server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/live/") {
			mu.Lock()
			refuse := refuseStream
			if !refuse {
				ctx, cancel := context.WithCancel(r.Context())
				cancelStream = cancel
				r = r.WithContext(ctx)
			}
			mu.Unlock()
			if refuse {
				http.Error(w, "unavailable", http.StatusServiceUnavailable)
				return
			}
			b.e.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		fail := failLive && r.Header.Get(handlers.LiveHeader) == "1"
		mu.Unlock()
		if fail {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			failed <- struct{}{}
			return
		}
		b.e.ServeHTTP(w, r)
	}))
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/payments/"+paid.ID)
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Registered")

	mu.Lock()
	failLive = true
	mu.Unlock()
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, paid.ID); err != nil {
		t.Fatal(err)
	}
	mustWaitC(t, failed, "the announced change's failed fetch")

	// The stream drops and its reconnect is refused: the page polls, and the polls fail.
	mu.Lock()
	refuseStream = true
	cancelStream()
	mu.Unlock()
	waitJS(t, ctx, "the page to poll", `document.documentElement.getAttribute("data-live-state") === "polling"`)
	for len(failed) > 0 {
		<-failed
	}
	mustWaitC(t, failed, "a failed poll")
	mustWaitC(t, failed, "another failed poll")

	// The stream is back (live.js's own reconnect): polling stops. Then the server answers again.
	mu.Lock()
	refuseStream = false
	mu.Unlock()
	waitJS(t, ctx, "the stream to open again", `document.documentElement.getAttribute("data-live-state") === "live"`)
	mu.Lock()
	failLive = false
	mu.Unlock()
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Completed")
}
