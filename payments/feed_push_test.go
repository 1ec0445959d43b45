package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/payments/gateway/webhooksig"
)

var shopSecret = []byte("the-shop-webhook-secret-of-32-chars!")

// shop is the events webhook's receiver: it checks each POST's signature against the test's
// clock, keeps the events, answers status, and parks the first POST when park is set.
type shop struct {
	t       *testing.T
	clock   *payments.ManualClock
	srv     *httptest.Server
	mu      sync.Mutex
	status  int
	posts   int
	events  []payments.FeedEventBody
	park    bool
	refuse  func(payments.FeedEventBody) bool // a POST carrying such an event is answered 422
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

// let releases the parked POST (once; again is a no-op).
func (s *shop) let() { s.once.Do(func() { close(s.release) }) }

func newShop(t *testing.T, clock *payments.ManualClock) *shop {
	s := &shop{t: t, clock: clock, status: http.StatusOK, arrived: make(chan struct{}, 10), release: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		if err := webhooksig.Verify(r.Header.Get(payments.EventsWebhookSignatureHeader), raw, [][]byte{shopSecret}, clock.Now(), 0); err != nil {
			t.Errorf("signature: %v", err)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("content type %q", ct)
		}
		var body payments.FeedBody
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Errorf("body %s: %v", raw, err)
		}
		s.mu.Lock()
		s.posts++
		parkThis := s.park && s.posts == 1
		status := s.status
		if s.refuse != nil && slices.ContainsFunc(body.Data, s.refuse) {
			status = http.StatusUnprocessableEntity
		}
		s.mu.Unlock()
		if parkThis {
			s.arrived <- struct{}{}
			<-s.release
		}
		if status/100 == 3 {
			w.Header().Set("Location", "/elsewhere") // followed, it would be a second POST here
		}
		if status/100 == 2 {
			s.mu.Lock()
			s.events = append(s.events, body.Data...)
			s.mu.Unlock()
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(s.srv.Close)
	t.Cleanup(s.let) // runs first: a test that fails with a POST parked does not hang in Close
	return s
}

func (s *shop) counts() (posts int, events []payments.FeedEventBody) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.posts, append([]payments.FeedEventBody(nil), s.events...)
}

func (s *shop) config(c *payments.Config) {
	c.EventsWebhook = payments.EventsWebhook{URL: s.srv.URL, Secrets: [][]byte{shopSecret}}
}

// push runs one round and fails the test on an error.
func push(t *testing.T, svc *payments.Service) int {
	t.Helper()
	n, err := svc.PushEvents(context.Background())
	if err != nil {
		t.Fatalf("PushEvents: %v", err)
	}
	return n
}

// feedReady waits until the feed has at least n events after the events webhook's cursor: the
// feed serves a change once every transaction that began writing before it has ended, in the
// whole cluster, and other tests hold transactions open on purpose.
func feedReady(t *testing.T, b *bench, n int) {
	t.Helper()
	var cursor string
	if err := b.pool.QueryRow(context.Background(), `SELECT cursor FROM events_webhook`).Scan(&cursor); err != nil {
		t.Fatal(err)
	}
	feedAll(t, b.plain, cursor, payments.MaxFeedRead, n)
}

// wantChanges checks the shop got exactly these orders' changes, in this order.
func wantChanges(t *testing.T, got []payments.FeedEventBody, want ...string) {
	t.Helper()
	var have []string
	for _, e := range got {
		have = append(have, e.OrderID+":"+e.Status)
	}
	if fmt.Sprint(have) != fmt.Sprint(want) {
		t.Fatalf("the shop got %v, want %v", have, want)
	}
}

// Delivery begins at the feed's end (a payment and its refund made before are not sent), then
// sends every change once, payments' and refunds', in order, signed; a backlog over one POST goes in pages within one round; a
// round with nothing new POSTs nothing.
func TestEventsWebhookDeliversEachChangeInOrder(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	svc := b.service(b.pool, "replica-a", sh.config)
	b.refundIn(t, b.completed(t, "o-before", 100), 10, "k-before")
	feedAll(t, b.plain, "", payments.MaxFeedRead, 5) // served: the feed's end is after them
	if n := push(t, svc); n != 0 {
		t.Fatalf("the first round sent %d events of the history", n)
	}
	paid := b.registered(t, "o-push-1", 1500)
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.plain.Check(context.Background(), api, paid.ID); err != nil {
		t.Fatal(err)
	}
	b.registered(t, "o-push-2", 700)
	refund := b.refundIn(t, paid, 500, "k-push")
	feedReady(t, b, 7)
	if n := push(t, svc); n != 7 {
		t.Fatalf("sent %d, want 7", n)
	}
	posts, got := sh.counts()
	wantChanges(t, got, "o-push-1:Registering", "o-push-1:Registered", "o-push-1:Completed", "o-push-2:Registering", "o-push-2:Registered",
		"o-push-1:Pending", "o-push-1:Succeeded")
	if posts != 1 || got[0].FromStatus != nil || got[2].PaymentID != paid.ID || got[2].Amount != 1500 ||
		got[6].Type != payments.FeedEventRefundStatus || got[6].RefundID != refund.ID || got[6].Amount != 500 {
		t.Fatalf("%d POSTs, events %+v", posts, got)
	}
	if n := push(t, svc); n != 0 {
		t.Fatalf("a round with nothing new sent %d", n)
	}
	if posts, _ := sh.counts(); posts != 1 {
		t.Fatalf("a round with nothing new POSTed (%d POSTs)", posts)
	}

	// A backlog of 110 changes: two POSTs (100 + 10) in one round, nothing lost or repeated.
	for i := range 55 {
		b.registered(t, fmt.Sprintf("o-backlog-%02d", i), 100)
	}
	feedReady(t, b, 110)
	if n := push(t, svc); n != 110 {
		t.Fatalf("backlog: sent %d, want 110", n)
	}
	posts, got = sh.counts()
	if posts != 3 || len(got) != 117 {
		t.Fatalf("backlog: %d POSTs, %d events", posts, len(got))
	}
	seen := map[string]bool{}
	for _, e := range got {
		if seen[e.ID] {
			t.Fatalf("event %s sent twice", e.ID)
		}
		seen[e.ID] = true
	}
	if n := b.count(t, `SELECT delivered_events FROM events_webhook`); n != 117 {
		t.Fatalf("delivered_events = %d", n)
	}
}

// A shop that does not answer 2xx keeps the cursor where it was: the same page is sent again
// after 1 s, then 2 s, and, once the shop answers, nothing is lost and nothing is sent before
// its time.
func TestEventsWebhookRetriesAfterAFailure(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	svc := b.service(b.pool, "replica-a", sh.config)
	if st := webhookStatus(t, svc); !st.On || st.Started {
		t.Fatalf("before the first round: %+v", st)
	}
	push(t, svc) // delivery begins
	b.registered(t, "o-retry", 900)
	feedReady(t, b, 2)
	posts := func() int { p, _ := sh.counts(); return p }

	// A redirect first (a failure, not followed: one POST), then a 503.
	for i, tc := range []struct {
		status int
		wait   time.Duration
	}{{http.StatusTemporaryRedirect, time.Second}, {http.StatusServiceUnavailable, 2 * time.Second}} {
		sh.mu.Lock()
		sh.status = tc.status
		sh.mu.Unlock()
		wait := tc.wait
		if n := push(t, svc); n != 0 || posts() != i+1 {
			t.Fatalf("failure %d: sent %d, %d POSTs", i+1, n, posts())
		}
		b.clock.Advance(wait - time.Millisecond)
		if push(t, svc); posts() != i+1 {
			t.Fatalf("POSTed again %v early", time.Millisecond)
		}
		b.clock.Advance(time.Millisecond)
	}
	if n := b.count(t, `SELECT attempts FROM events_webhook WHERE last_error LIKE '%answered 503'`); n != 2 {
		t.Fatalf("attempts recorded = %d", n)
	}
	if st, err := b.plain.Stats(context.Background()); err != nil || st.EventsWebhookFailures != 2 || st.EventsWebhookLag != 3*time.Second {
		t.Fatalf("Stats: %d failures, lag %v, %v; want 2 (pitlane_events_webhook_failures) and 3s since the payment (pitlane_events_webhook_lag_seconds)",
			st.EventsWebhookFailures, st.EventsWebhookLag, err)
	}
	// The Operations page's view of it, from a replica that does not push: failing, what waits.
	st := webhookStatus(t, b.plain)
	if st.On || !st.Started || st.Failures != 2 || st.LastError != "the shop's endpoint answered 503" ||
		st.NextAttemptAt == nil || !st.NextAttemptAt.Equal(b.clock.Now()) || // (the 503 came 2 s ago, its wait ends now)
		st.Waiting != 2 || st.OldestWaiting == nil || !st.OldestWaiting.Equal(t0) || st.DeliveredAt != nil || st.LeaseOwner != "" {
		t.Fatalf("status while failing: %+v", st)
	}
	b.clock.Advance(4 * time.Second)
	sh.mu.Lock()
	sh.status = http.StatusNoContent
	sh.mu.Unlock()
	if n := push(t, svc); n != 2 {
		t.Fatalf("after the shop recovered: sent %d", n)
	}
	_, got := sh.counts()
	wantChanges(t, got, "o-retry:Registering", "o-retry:Registered")
	if n := b.count(t, `SELECT attempts FROM events_webhook WHERE last_error = '' AND next_attempt_at IS NULL`); n != 0 {
		t.Fatalf("attempts after success = %d", n)
	}
	if st, err := b.plain.Stats(context.Background()); err != nil || st.EventsWebhookFailures != 0 || st.EventsWebhookLag != 0 {
		t.Fatalf("Stats after success: %d failures, lag %v, %v", st.EventsWebhookFailures, st.EventsWebhookLag, err)
	}
	if st := webhookStatus(t, svc); st.Failures != 0 || st.LastError != "" || st.Waiting != 0 || st.OldestWaiting != nil ||
		st.DeliveredEvents != 2 || st.DeliveredAt == nil || !st.DeliveredAt.Equal(b.clock.Now()) {
		t.Fatalf("status after success: %+v", st)
	}
}

func webhookStatus(t *testing.T, svc *payments.Service) payments.EventsWebhookState {
	t.Helper()
	st, err := svc.EventsWebhookStatus(context.Background())
	if err != nil {
		t.Fatalf("EventsWebhookStatus: %v", err)
	}
	return st
}

// parkedPush: two replicas with the events webhook, delivery begun, one payment of order made,
// and replica A's round POSTing its two changes, parked at the shop. done gets what A's round
// returns once the shop lets the POST go (sh.let).
func parkedPush(t *testing.T, order string) (b *bench, sh *shop, other *payments.Service, done <-chan int) {
	t.Helper()
	b = newBench(t)
	sh = newShop(t, b.clock)
	a := b.service(b.pool, "replica-a", sh.config)
	other = b.service(b.pool, "replica-b", sh.config)
	push(t, a)
	b.registered(t, order, 500)
	feedReady(t, b, 2)
	sh.mu.Lock()
	sh.park = true
	sh.mu.Unlock()
	ch := make(chan int, 1)
	go func() { n, _ := a.PushEvents(context.Background()); ch <- n }()
	mustWait(t, sh.arrived, "A's POST at the shop")
	return b, sh, other, ch
}

// Two replicas' patrols tick together: while replica A's POST is in flight (parked at the shop),
// replica B's round finds the row leased and POSTs nothing. Negative control (run by hand):
// without the lease condition in the take, B POSTs the same page beside A.
func TestEventsWebhookOneReplicaAtATime(t *testing.T) {
	t.Parallel()
	_, sh, other, done := parkedPush(t, "o-one")
	if n := push(t, other); n != 0 {
		t.Fatalf("B sent %d while A's POST was in flight", n)
	}
	if posts, _ := sh.counts(); posts != 1 {
		t.Fatalf("%d POSTs while A's was in flight, want 1", posts)
	}
	if st := webhookStatus(t, other); st.LeaseOwner != "replica-a" || st.Waiting != 2 {
		t.Fatalf("status while A's POST is in flight: %+v", st)
	}
	sh.let()
	if n := mustWait(t, done, "A's round"); n != 2 {
		t.Fatalf("A sent %d", n)
	}
	_, got := sh.counts()
	wantChanges(t, got, "o-one:Registering", "o-one:Registered")
}

// A's POST outlives its lease (a slow shop): B takes over and sends A's page and what came
// since, which the shop acknowledges; A's late acknowledgement then writes nothing, so the
// cursor does not go back (which would send o-later again) and the next round sends only what
// is new. A's page arrived twice (at least once), nothing was skipped. Negative control (run by
// hand): the acknowledgement's UPDATE without its lease token moves the cursor back.
func TestEventsWebhookLeaseLapseSendsAgainNeverSkips(t *testing.T) {
	t.Parallel()
	b, sh, other, done := parkedPush(t, "o-slow")
	b.clock.Advance(2*payments.EventsWebhookTimeout + time.Second) // A's lease ran out
	b.registered(t, "o-later", 400)
	feedReady(t, b, 4)
	if n := push(t, other); n != 4 {
		t.Fatalf("B sent %d after A's lease ran out, want A's page and o-later's changes (4)", n)
	}
	var cursor string
	if err := b.pool.QueryRow(context.Background(), `SELECT cursor FROM events_webhook`).Scan(&cursor); err != nil {
		t.Fatal(err)
	}
	sh.let() // A's POST is acknowledged now, late
	mustWait(t, done, "A's round")
	var after string
	if err := b.pool.QueryRow(context.Background(), `SELECT cursor FROM events_webhook`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != cursor {
		t.Fatalf("A's late acknowledgement moved the cursor from %s to %s", cursor, after)
	}
	b.registered(t, "o-next", 300)
	feedReady(t, b, 2)
	if n := push(t, other); n != 2 {
		t.Fatalf("the next round sent %d, want o-next's 2", n)
	}
	_, got := sh.counts()
	wantChanges(t, got, "o-slow:Registering", "o-slow:Registered", "o-later:Registering", "o-later:Registered",
		"o-slow:Registering", "o-slow:Registered", "o-next:Registering", "o-next:Registered")
}

// A shop that holds the events webhook's POST does not hold the patrol: with the POST parked at
// the shop, a session that falls due is still driven (its gateway look arrives). Shutdown then
// cuts the POST and gives the row back without counting a failure. Negative control (run by
// hand): pushing from inside the patrol's loop leaves the due session undriven.
func TestSlowShopDoesNotHoldThePatrol(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	svc := b.service(b.pool, "replica-a", sh.config)
	b.reconcileElsewhere(t)
	push(t, svc)
	due := b.registered(t, "o-due", 100) // due at its first look, 5 s on
	feedReady(t, b, 2)
	sh.mu.Lock()
	sh.park = true
	sh.mu.Unlock()
	look := b.gw.Hold(fakegw.OpStatus)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.RunSweeper(ctx, 10*time.Millisecond); close(done) }()
	mustWait(t, sh.arrived, "the webhook's POST at the shop")
	b.clock.Advance(payments.DefaultBackoff[0] + time.Second)
	if id := mustWait(t, look.Arrived(), "the patrol's look at the due session while the shop holds the POST"); id != due.GatewayPaymentID {
		t.Fatalf("looked at %s, want %s", id, due.GatewayPaymentID)
	}
	if n := b.count(t, `SELECT count(*) FROM events_webhook WHERE attempts = 0 AND lease_token IS NOT NULL`); n != 1 {
		t.Fatal("the look came only after the POST had ended (timed out): the shop held the patrol")
	}
	look.Open()
	cancel()
	mustWait(t, done, "the sweeper to stop")
	if n := b.count(t, `SELECT count(*) FROM events_webhook WHERE attempts = 0 AND lease_token IS NULL AND last_error = ''`); n != 1 {
		t.Fatal("shutdown's cut POST was counted as a failure or kept its lease")
	}
}

// "Send now": an operator who fixed the shop's endpoint ends the wait after failed POSTs; the
// next round sends at once (before: up to five minutes later), audited. Nothing to end while
// delivery is not waiting.
func TestEventsWebhookSendNow(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	svc := b.service(b.pool, "replica-a", sh.config)
	ops := payments.Staff{Email: "admin@example.com", Role: "admin"}
	if err := svc.RetryEventsWebhookNow(context.Background(), ops); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("before delivery began: %v, want conflict", err)
	}
	push(t, svc)
	b.registered(t, "o-send-now", 700)
	feedReady(t, b, 2)
	sh.mu.Lock()
	sh.status = http.StatusBadGateway
	sh.mu.Unlock()
	posts := func() int { p, _ := sh.counts(); return p }
	push(t, svc)
	if push(t, svc); posts() != 1 {
		t.Fatalf("%d POSTs during the wait, want 1", posts())
	}
	sh.mu.Lock()
	sh.status = http.StatusOK
	sh.mu.Unlock()
	// The click of an admin disabled while it was on its way ends nothing, as no console change
	// of theirs does (staffStands; a review: it ended the wait). Negative control: without it,
	// the wait ends and the next round sends.
	acc := access.New(b.pool, b.clock)
	acc.PasswordCost = 4
	for _, email := range []string{staffAdminUser.Email, ops.Email} {
		if _, err := acc.CreateUser(context.Background(), payments.Staff{Email: "cli:test"}, email, access.RoleAdmin, "correct horse battery staple"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := acc.DisableUser(context.Background(), staffAdminUser, ops.Email); err != nil {
		t.Fatal(err)
	}
	offboarded := payments.WithStaffSession(context.Background(), ops.Email, ops.Role, 0)
	if err := svc.RetryEventsWebhookNow(offboarded, ops); !errors.Is(err, payments.ErrStaffSessionEnded) {
		t.Fatalf("a disabled admin's send now: %v, want their session ended", err)
	}
	if push(t, svc); posts() != 1 {
		t.Fatalf("%d POSTs after a disabled admin's send now, want still 1", posts())
	}
	if err := svc.RetryEventsWebhookNow(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	if n := push(t, svc); n != 2 || posts() != 2 {
		t.Fatalf("after send now: sent %d in %d POSTs", n, posts())
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND actor = 'admin@example.com' AND detail LIKE '%after 1 failed POSTs%'`,
		payments.AuditEventsWebhookRetry); n != 1 {
		t.Fatalf("send now audited %d times", n)
	}
	if err := svc.RetryEventsWebhookNow(context.Background(), ops); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("while delivering: %v, want conflict", err)
	}
}

// A failed POST to a webhook is recorded without its URL: a user name, a path or a token in the
// query stays out of the log, the outbox and events_webhook.last_error (the Operations page
// shows it to support). What failed stays: the refusal, the status.
// Negative control (run by hand): returning the client's error as it is puts the URL in both.
func TestWebhookErrorsNameNoURL(t *testing.T) {
	t.Parallel()
	closed := httptest.NewServer(http.NotFoundHandler())
	refused := "http://shop-user:pw@" + closed.Listener.Addr().String() + "/hook-path?token=SECRET-TOKEN"
	closed.Close()
	answers500 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	t.Cleanup(answers500.Close)
	leaks := func(msg string) bool {
		return strings.Contains(msg, "SECRET-TOKEN") || strings.Contains(msg, "shop-user") || strings.Contains(msg, "hook-path")
	}

	for _, tc := range []struct{ url, want string }{{refused, "refused"}, {answers500.URL + "/hook-path?token=SECRET-TOKEN", "500"}} {
		err := payments.WebhookNotifier{URL: tc.url}.Notify(context.Background(), payments.Message{To: "c@example.com", Kind: "cancel_code", Text: "x"})
		if err == nil || leaks(err.Error()) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("notify to %s: %v", tc.url, err)
		}
	}

	b := newBench(t)
	svc := b.service(b.pool, "replica-a", func(c *payments.Config) {
		c.EventsWebhook = payments.EventsWebhook{URL: refused, Secrets: [][]byte{shopSecret}}
	})
	push(t, svc) // delivery begins
	b.registered(t, "o-hook-refused", 900)
	feedReady(t, b, 2)
	push(t, svc)
	var last string
	if err := b.pool.QueryRow(context.Background(), `SELECT coalesce(last_error, '') FROM events_webhook`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if last == "" || leaks(last) || !strings.Contains(last, "refused") {
		t.Fatalf("events_webhook.last_error = %q", last)
	}
}

// A round whose page took so long to read that less of its lease is left than a POST may take
// sends nothing: it gives the row back, and the next round reads again with a fresh lease. A
// POST started with the lease nearly spent could outlive it while another replica takes the row
// over and sends this page, or the next one, beside it — out of order at the shop.
// Negative control (run by hand): without the check, the page is POSTed with 9 s of the lease
// left.
func TestEventsWebhookDoesNotPostOnALeaseNearlySpent(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	slow := true
	svc := b.service(b.pool, "replica-a", sh.config, func(c *payments.Config) {
		c.Hooks.AfterEventsPageRead = func(context.Context) {
			if slow {
				b.clock.Advance(payments.EventsWebhookTimeout + time.Second) // the feed read took 11 s
			}
		}
	})
	push(t, svc) // delivery begins
	b.registered(t, "o-slow-read", 700)
	feedReady(t, b, 2)
	if n := push(t, svc); n != 0 {
		t.Fatalf("sent %d with the lease nearly spent", n)
	}
	if posts, _ := sh.counts(); posts != 0 {
		t.Fatalf("%d POSTs with the lease nearly spent", posts)
	}
	if st := webhookStatus(t, svc); st.Failures != 0 || st.LeaseOwner != "" {
		t.Fatalf("after the round: %+v, want no failure counted and the row given back", st)
	}
	slow = false
	if n := push(t, svc); n != 2 {
		t.Fatalf("the next round sent %d, want 2", n)
	}
}

// A rolling change of EVENTS_WEBHOOK_URL hands the feed over whole: while a replica of the old
// URL still delivers, one with the new URL sends nothing; once no replica of the old URL has
// taken the row for EventsWebhookHandover, the new one delivers from the cursor on. Each URL
// gets one unbroken part of the feed. Before, both replicas POSTed to their own URL and moved
// the one cursor: the old endpoint got o-url-1's changes, the new one o-url-2's (an outside
// review).
func TestEventsWebhookURLChangeHandsTheFeedOverWhole(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	oldShop, newShop := newShop(t, b.clock), newShop(t, b.clock)
	oldRep := b.service(b.pool, "replica-old", oldShop.config)
	newRep := b.service(b.pool, "replica-new", newShop.config)
	push(t, oldRep) // delivery begins at the feed's end
	b.registered(t, "o-url-1", 100)
	feedReady(t, b, 2)
	push(t, oldRep)
	b.registered(t, "o-url-2", 200)
	feedReady(t, b, 2)
	if n := push(t, newRep); n != 0 {
		t.Fatalf("the new URL's replica sent %d events while the old URL's still delivers", n)
	}
	push(t, oldRep)
	_, got := oldShop.counts()
	wantChanges(t, got, "o-url-1:Registering", "o-url-1:Registered", "o-url-2:Registering", "o-url-2:Registered")

	// The old URL's replicas are gone: a minute later the new URL takes over from the cursor.
	b.registered(t, "o-url-3", 300)
	feedReady(t, b, 2)
	b.clock.Advance(payments.EventsWebhookHandover - time.Second)
	if n := push(t, newRep); n != 0 {
		t.Fatalf("the new URL's replica took over %d events before the handover", n)
	}
	b.clock.Advance(time.Second)
	if n := push(t, newRep); n != 2 {
		t.Fatalf("the new URL's replica sent %d events after the handover, want o-url-3's two", n)
	}
	_, got = newShop.counts()
	wantChanges(t, got, "o-url-3:Registering", "o-url-3:Registered")
	if n := push(t, oldRep); n != 0 {
		t.Fatalf("a replica of the old URL, back, sent %d events", n)
	}
}

// The old URL's replicas fail and back off (their last take over a minute ago, the next one due
// later still): the new URL's replica takes the feed over at the handover, not once the old
// URL's back-off ends (up to EventsWebhookMaxBackoff, then a race with the old URL's replicas; a
// review of the events webhook, docs/operations.md's promise). Negative control (run by hand):
// with the back-off binding every URL, nothing taken over.
func TestEventsWebhookBackingOffURLIsTakenOverAtTheHandover(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	oldShop, newShop := newShop(t, b.clock), newShop(t, b.clock)
	oldRep := b.service(b.pool, "replica-old", oldShop.config)
	newRep := b.service(b.pool, "replica-new", newShop.config)
	push(t, oldRep)
	b.registered(t, "o-url-backoff", 100)
	feedReady(t, b, 2)
	oldShop.mu.Lock()
	oldShop.status = http.StatusNotFound
	oldShop.mu.Unlock()
	for i := range 7 { // waits of 1, 2, 4 … 32 s, the last one 64 s
		push(t, oldRep)
		if i < 6 {
			b.clock.Advance(time.Duration(1<<i) * time.Second)
		}
	}
	if st := webhookStatus(t, newRep); st.Failures != 7 || st.NextAttemptAt == nil || !st.NextAttemptAt.After(b.clock.Now().Add(payments.EventsWebhookHandover)) {
		t.Fatalf("setup: %d failures, next attempt %v", st.Failures, st.NextAttemptAt)
	}
	b.clock.Advance(payments.EventsWebhookHandover + time.Second)
	if n := push(t, newRep); n != 2 {
		t.Fatalf("the old URL has backed off for over a minute; the new URL's replica sent %d, want the 2 waiting", n)
	}
	if st := webhookStatus(t, newRep); st.Failures != 0 {
		t.Fatalf("delivered, and %d failures in a row", st.Failures)
	}
}

// Two URLs both failing (a rolling change of EVENTS_WEBHOOK_URL stuck half way, one replica's
// typo, the shop down): the row goes from one to the other at the handover, and the failures in
// a row are counted on: reset at each change of URL, the back-off never grew past a minute and
// the alert (five failures, for ten minutes) never fired while the shop heard nothing (a review
// of the handover's fix). Negative control (run by hand): with the count reset at a change of
// URL, it falls back to 1.
func TestTwoFailingEventsWebhookURLsKeepCountingTheirFailures(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	shopA, shopB := newShop(t, b.clock), newShop(t, b.clock)
	a := b.service(b.pool, "replica-a", shopA.config)
	other := b.service(b.pool, "replica-b", shopB.config)
	push(t, a)
	b.registered(t, "o-two-failing", 100)
	feedReady(t, b, 2)
	for _, sh := range []*shop{shopA, shopB} {
		sh.mu.Lock()
		sh.status = http.StatusServiceUnavailable
		sh.mu.Unlock()
	}
	highest := 0
	for range 40 { // 40 minutes, each replica trying every 30 s
		for _, rep := range []*payments.Service{a, other} {
			push(t, rep)
			b.clock.Advance(30 * time.Second)
			st := webhookStatus(t, rep)
			if st.Failures < highest {
				t.Fatalf("the failures in a row went down from %d to %d while every POST failed", highest, st.Failures)
			}
			highest = st.Failures
		}
	}
	postsA, _ := shopA.counts()
	postsB, _ := shopB.counts()
	if highest < 5 || postsA == 0 || postsB == 0 {
		t.Fatalf("after 40 minutes: %d failures in a row, %d and %d POSTs", highest, postsA, postsB)
	}
}

// The runbook's fixes of a failing webhook — a lost cursor set to an event the shop has, a page
// the shop refuses for ever skipped by setting the cursor past it — left the card and
// pitlane_events_webhook_failures (its alert) "failing" until a later event was delivered: a
// round that found nothing after the cursor gave the row back and kept the count (a review of
// the events webhook). Nothing after the cursor is nothing failing. Negative control (run by
// hand): with the old give-back, both stay failing.
func TestAFixedEventsWebhookStopsFailingWithNothingToSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func(t *testing.T, b *bench, sh *shop) // makes the rounds fail
		fix  func(t *testing.T, b *bench, sh *shop, good string)
	}{
		{"a lost cursor set right", func(t *testing.T, b *bench, _ *shop) {
			b.exec(t, `UPDATE events_webhook SET cursor = '18446744073709551615-9223372036854775807'`)
		}, func(t *testing.T, b *bench, _ *shop, good string) {
			b.exec(t, `UPDATE events_webhook SET cursor = $1`, good)
		}},
		{"a refused page skipped", func(t *testing.T, b *bench, sh *shop) {
			b.registered(t, "o-poison-page", 100)
			feedReady(t, b, 2)
			sh.mu.Lock()
			sh.status = http.StatusInternalServerError
			sh.mu.Unlock()
		}, func(t *testing.T, b *bench, sh *shop, _ string) {
			page, err := b.plain.Feed(context.Background(), "", payments.MaxFeedRead)
			if err != nil {
				t.Fatal(err)
			}
			b.exec(t, `UPDATE events_webhook SET cursor = $1`, page.Next)
			sh.mu.Lock()
			sh.status = http.StatusOK
			sh.mu.Unlock()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			sh := newShop(t, b.clock)
			rep := b.service(b.pool, "replica-a", sh.config)
			push(t, rep)
			b.registered(t, "o-delivered", 100)
			feedReady(t, b, 2)
			push(t, rep)
			var good string
			if err := b.pool.QueryRow(context.Background(), `SELECT cursor FROM events_webhook`).Scan(&good); err != nil {
				t.Fatal(err)
			}
			tc.fail(t, b, sh)
			for range 5 {
				push(t, rep)
				b.clock.Advance(5 * time.Minute)
			}
			if st := webhookStatus(t, rep); st.Failures != 5 {
				t.Fatalf("setup: %d failures", st.Failures)
			}
			tc.fix(t, b, sh, good)
			if n := push(t, rep); n != 0 {
				t.Fatalf("%d events sent after the fix, want none: nothing after the cursor", n)
			}
			st := webhookStatus(t, rep)
			stats, err := b.plain.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.Failures != 0 || st.LastError != "" || st.NextAttemptAt != nil || stats.EventsWebhookFailures != 0 {
				t.Fatalf("fixed, nothing to send: card failures %d, last error %q, next attempt %v; pitlane_events_webhook_failures %d",
					st.Failures, st.LastError, st.NextAttemptAt, stats.EventsWebhookFailures)
			}
		})
	}
}

// A shop that refuses one event (a poison event: its handler fails on it, whatever the page)
// got the same page of 100 POSTed for ever: the events before it never arrived, and nothing
// said which one it was (a review of the events webhook). The page halves at each failure: the
// events the shop takes are delivered, the one it refuses ends up alone in the page, and the
// card names it; set as the cursor (the runbook), it is skipped and delivery goes on. Negative
// control (run by hand): with pages of EventsWebhookBatch always, none of the first orders'
// events is delivered.
func TestEventsWebhookPagesHalveToTheEventTheShopRefuses(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	rep := b.service(b.pool, "replica-a", sh.config)
	push(t, rep)
	for _, o := range []string{"o-before-1", "o-before-2", "o-before-3"} {
		b.registered(t, o, 100)
	}
	b.registered(t, "o-poison", 100)
	b.registered(t, "o-after", 100)
	feedReady(t, b, 10)
	sh.mu.Lock()
	sh.refuse = func(e payments.FeedEventBody) bool { return e.OrderID == "o-poison" && e.Status == "Registering" }
	sh.mu.Unlock()
	var st payments.EventsWebhookState
	for round := 0; ; round++ {
		if round == 20 {
			t.Fatalf("after 20 rounds: %+v", st)
		}
		push(t, rep)
		b.clock.Advance(payments.EventsWebhookMaxBackoff)
		if st = webhookStatus(t, rep); st.Failures > 0 && payments.EventsWebhookPageSize(st.Failures) == 1 {
			break
		}
	}
	_, got := sh.counts()
	wantChanges(t, got, "o-before-1:Registering", "o-before-1:Registered", "o-before-2:Registering", "o-before-2:Registered",
		"o-before-3:Registering", "o-before-3:Registered")
	if st.FirstWaitingOrder != "o-poison" || st.FirstWaiting == "" || st.Waiting != 4 {
		t.Fatalf("the card: first waiting %q of order %q, %d waiting; want o-poison's Registering, 4 waiting", st.FirstWaiting, st.FirstWaitingOrder, st.Waiting)
	}
	b.exec(t, `UPDATE events_webhook SET cursor = $1`, st.FirstWaiting) // the runbook's skip
	if n := push(t, rep); n != 3 {
		t.Fatalf("%d events sent after the skip, want the 3 after the refused one", n)
	}
	_, got = sh.counts()
	wantChanges(t, got[6:], "o-poison:Registered", "o-after:Registering", "o-after:Registered")
	if st := webhookStatus(t, rep); st.Failures != 0 || st.FirstWaiting != "" {
		t.Fatalf("after the skip: %d failures, first waiting %q", st.Failures, st.FirstWaiting)
	}
}

// A cursor of a lost history (the database restored to an earlier point) can never be read on:
// the round counts a failed attempt that says so, so the Operations page and
// pitlane_events_webhook_failures (its alert) show it. Before, each round logged an error and
// counted nothing: the shop heard of no change and no alert fired.
func TestEventsWebhookOnALostCursorCountsAFailure(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	shop := newShop(t, b.clock)
	rep := b.service(b.pool, "replica-a", shop.config)
	push(t, rep)
	if _, err := b.pool.Exec(context.Background(), `UPDATE events_webhook SET cursor = '18446744073709551615-9223372036854775807'`); err != nil {
		t.Fatal(err)
	}
	if n := push(t, rep); n != 0 {
		t.Fatalf("%d events sent after a lost cursor", n)
	}
	st, err := rep.EventsWebhookStatus(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Failures != 1 || st.NextAttemptAt == nil || !strings.Contains(st.LastError, "is lost") {
		t.Fatalf("after a lost cursor: %d failures, next attempt %v, last error %q; want one failure saying the cursor is lost",
			st.Failures, st.NextAttemptAt, st.LastError)
	}
	if posts, _ := shop.counts(); posts != 0 {
		t.Fatalf("%d POSTs", posts)
	}
}

// A page's work lasts its lease at most (twice EventsWebhookTimeout), its record RecordGrace
// after that: here the database stops answering once the page is read (the pool's only
// connection is taken). The shop gets the page; the cursor is not moved (the next round sends it
// again: at least once). Under the loop's context alone, the round — and the replica's
// deliveries — waited as long as the database did (negative control: still waiting after a
// minute).
func TestAnEventsWebhookPageWaitsForASilentDatabaseNoLongerThanItsLease(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	one := testdb.PoolOf(t, b.pool, 1)
	heldc := make(chan *pgxpool.Conn, 1)
	silent := false
	svc := b.service(one, "replica-a", sh.config, func(c *payments.Config) {
		c.Hooks.AfterEventsPageRead = func(context.Context) {
			if !silent {
				return
			}
			held, err := one.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			heldc <- held
		}
	})
	push(t, svc) // delivery begins
	b.registered(t, "o-silent-push", 700)
	feedReady(t, b, 2)
	silent = true
	err := answeredWithinAMinute(t, heldc, "the events webhook round", func() error {
		_, err := svc.PushEvents(context.Background())
		return err
	})
	(<-heldc).Release()
	if err == nil {
		t.Fatal("the round ended well though the database did not answer its record")
	}
	if posts, _ := sh.counts(); posts != 1 {
		t.Fatalf("%d POSTs, want the page sent once", posts)
	}
	silent = false
	b.clock.Advance(2 * payments.EventsWebhookTimeout) // the round's lease ran out (nothing gave it back)
	if n := push(t, svc); n != 2 {
		t.Fatalf("the next round sent %d, want the page again (its cursor was not moved)", n)
	}
}

// A transaction left open in the cluster (a psql session after BEGIN and a write) holds every
// event back from the feed, by design (docs/operations.md, "The events feed and long
// transactions"). The shop heard nothing of two committed changes for 15 minutes, yet the events
// webhook's lag (pitlane_events_webhook_lag_seconds, PitlaneEventsWebhookBehind) was 0 and the
// Operations card said nothing waited: both counted only what the feed already served. From an
// outside review; negative control: eventsAfter bounded by feedServes again (lag 0, 0 waiting).
func TestEventsWebhookLagCountsEventsHeldBackByAnOpenTransaction(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	svc := b.service(b.pool, "replica-a", sh.config)
	push(t, svc) // delivery begins at the feed's end
	ctx := context.Background()
	holder, _ := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // it has a transaction id, as a write gives
		t.Fatal(err)
	}
	b.registered(t, "o-held-back", 900) // committed: two events
	b.clock.Advance(15 * time.Minute)
	if n := push(t, svc); n != 0 {
		t.Fatalf("sent %d events while the feed holds them back", n)
	}
	st, err := b.plain.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ws := webhookStatus(t, b.plain); st.EventsWebhookLag < 15*time.Minute || ws.Waiting != 2 {
		t.Fatalf("the shop has heard nothing of 2 committed changes for 15 minutes, yet the lag is %v and %d wait", st.EventsWebhookLag, ws.Waiting)
	}
}

// docs/operations.md: "To send again from an earlier point, set cursor to an event id the feed
// returned". When the operator's UPDATE landed while a page was on its way to the shop (a slow
// shop keeps one in flight most of the time), the page's acknowledgement wrote its own end over
// it: the rewind was lost and the events never sent again. The acknowledgement moves the cursor
// only from where its page was read. From an outside review; negative control: the
// acknowledgement's cursor = $2 again (left at the page's end).
func TestAnOperatorsRewindOfTheEventsWebhookDuringAPostIsKept(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	var rewindTo string
	var armed atomic.Bool
	svc := b.service(b.pool, "replica-a", sh.config, func(c *payments.Config) {
		c.Hooks.AfterEventsPageRead = func(ctx context.Context) {
			if !armed.CompareAndSwap(true, false) {
				return
			}
			// The operator's runbook statement, while this page is on its way to the shop.
			if _, err := b.pool.Exec(ctx, `UPDATE events_webhook SET cursor = $1`, rewindTo); err != nil {
				t.Errorf("operator's UPDATE: %v", err)
			}
		}
	})
	push(t, svc) // delivery begins at the feed's end
	b.registered(t, "o-rewind-1", 500)
	feedReady(t, b, 2)
	if n := push(t, svc); n != 2 {
		t.Fatalf("sent %d, want o-rewind-1's 2", n)
	}
	_, got := sh.counts()
	rewindTo = got[0].ID // "an event id the feed returned": send again what came after it

	// Control: the same UPDATE between two rounds does what the runbook says.
	if _, err := b.pool.Exec(context.Background(), `UPDATE events_webhook SET cursor = $1`, rewindTo); err != nil {
		t.Fatal(err)
	}
	if n := push(t, svc); n != 1 {
		t.Fatalf("control: after a rewind between rounds sent %d, want o-rewind-1:Registered again", n)
	}
	b.registered(t, "o-rewind-2", 600)
	feedReady(t, b, 2)
	armed.Store(true)
	if n := push(t, svc); n != 2 { // o-rewind-2's page, during which the operator rewinds
		t.Fatalf("sent %d, want o-rewind-2's 2", n)
	}
	var cursor string
	if err := b.pool.QueryRow(context.Background(), `SELECT cursor FROM events_webhook`).Scan(&cursor); err != nil {
		t.Fatal(err)
	}
	if cursor != rewindTo {
		t.Errorf("the operator set the cursor to %s during a POST; the POST's acknowledgement left it at %s", rewindTo, cursor)
	}
	push(t, svc) // the round after: the runbook promises what came after rewindTo again
	_, got = sh.counts()
	wantChanges(t, got, "o-rewind-1:Registering", "o-rewind-1:Registered", "o-rewind-1:Registered",
		"o-rewind-2:Registering", "o-rewind-2:Registered",
		"o-rewind-1:Registered", "o-rewind-2:Registering", "o-rewind-2:Registered")
}

// A cursor set by hand that is not an event id ('end', the feed API's word for its end; an id
// pasted with a space) failed every replica's stats (pitlane_stats_up 0, every database gauge
// gone) and the Operations page's card, while the webhook sent nothing and counted no failure.
// Migration 00910 refuses such a value; one already there (the constraint is NOT VALID) counts
// nothing waiting, and each round counts a failure that says why (PitlaneEventsWebhookFailing).
// From an outside review; negative controls: without the constraint the UPDATE is taken; with
// eventsAfter's parse error returned, Stats fails; without the EINVALID failure, attempts stay 0.
func TestAnEventsWebhookCursorSetByHandMustBeAnEventID(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	svc := b.service(b.pool, "replica-a", sh.config)
	ctx := context.Background()
	push(t, svc) // delivery begins
	for _, cursor := range []string{"end", " 1234-5678", "1234-5678 ", "1234"} {
		_, err := b.pool.Exec(ctx, `UPDATE events_webhook SET cursor = $1`, cursor)
		if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Errorf("cursor %q set by hand: %v, want a check violation", cursor, err)
		}
	}
	// One from before the constraint.
	if _, err := b.pool.Exec(ctx, `ALTER TABLE events_webhook DROP CONSTRAINT events_webhook_cursor_is_an_event_id;
		UPDATE events_webhook SET cursor = 'end'`); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Stats(ctx); err != nil {
		t.Errorf("Stats (every replica's gauges) with the cursor 'end': %v", err)
	}
	b.registered(t, "o-edit", 500)
	b.clock.Advance(time.Minute)
	if _, err := svc.PushEvents(ctx); err != nil {
		t.Fatal(err)
	}
	ws := webhookStatus(t, svc)
	if posts, _ := sh.counts(); posts != 0 || ws.Failures != 1 || !strings.Contains(ws.LastError, "not an event id") {
		t.Errorf("a round from the cursor 'end': %d POSTs, %d failures counted (%q)", posts, ws.Failures, ws.LastError)
	}
}

// A POST cut by the replica's stop may still be at the shop: the row is given back once it can
// no longer land (its start + EventsWebhookTimeout), not at once — then the next replica's newer
// page reached the shop before the cut one (docs/api.md: no POST lands after the taker's next
// page; an outside review, stop). No attempt is counted. Negative control (run by hand): given
// back at once, replica B sends at the same instant.
func TestAnEventsPostCutByTheStopIsNotOvertaken(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sh := newShop(t, b.clock)
	a := b.service(b.pool, "replica-stopping", sh.config)
	other := b.service(b.pool, "replica-b", sh.config)
	push(t, a)
	b.registered(t, "o-cut", 500)
	feedReady(t, b, 2)
	sh.mu.Lock()
	sh.park = true
	sh.mu.Unlock()
	actx, stopA := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { n, _ := a.PushEvents(actx); done <- n }()
	mustWait(t, sh.arrived, "A's POST at the shop")
	stopA() // SIGTERM: A's POST is cut while the shop still has it
	mustWait(t, done, "A's round")
	if n := push(t, other); n != 0 {
		t.Fatalf("replica B sent %d events while A's cut POST could still land", n)
	}
	sh.let()
	b.clock.Advance(payments.EventsWebhookTimeout)
	if n := push(t, other); n == 0 {
		t.Fatal("replica B sent nothing once the cut POST could no longer land")
	}
	if n := b.count(t, `SELECT attempts FROM events_webhook`); n != 0 {
		t.Errorf("attempts = %d, want 0: the stop is not the shop's failure", n)
	}
}
