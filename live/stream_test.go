package live

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"
)

// Tests of the hub and the stream loop alone, with a hand-driven clock: no database, no
// sleeping. listener_test.go runs the hub against PostgreSQL.

// recSink records what a stream wrote, one line per message.
type recSink struct{ got chan string }

func newRecSink() *recSink { return &recSink{got: make(chan string, 1000)} }

func (r *recSink) Refresh(id string) error { r.got <- "refresh " + id; return nil }
func (r *recSink) Down() error             { r.got <- "down"; return nil }
func (r *recSink) Ping() error             { r.got <- "ping"; return nil }

func (r *recSink) next(t *testing.T) string {
	t.Helper()
	select {
	case s := <-r.got:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the stream to write")
		return ""
	}
}

// quiet asserts the stream wrote nothing more. A heartbeat is handed to the stream only when
// its loop waits again, so once the wake-up is taken and a heartbeat came through after it,
// whatever the loop did about the wake-up is written (before that heartbeat's ping).
func (r *recSink) quiet(t *testing.T, ht *ManualTimers, sub *Subscription) {
	t.Helper()
	for {
		idle := len(sub.wake) == 0
		ht.Beat()
		if got := r.next(t); got != "ping" {
			t.Fatalf("stream wrote %q, want nothing more", got)
		}
		if idle {
			return
		}
	}
}

// serve runs the stream in a goroutine and returns once its loop waits (its timers armed); the
// channel delivers how it ended (the test's cleanup stops it if it still runs).
func serve(t *testing.T, ht *ManualTimers, s *Subscription) (*recSink, <-chan error) {
	t.Helper()
	sink := newRecSink()
	ctx, cancel := context.WithCancel(context.Background())
	done, ended := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(ended)
		done <- s.Serve(ctx, sink)
	}()
	t.Cleanup(func() {
		cancel()
		<-ended
	})
	sink.quiet(t, ht, s)
	return sink, done
}

func upHub(ht *ManualTimers) *Hub {
	h := New(Config{Timers: ht, Debounce: time.Second, Lifetime: time.Hour})
	h.setUp()
	return h
}

// TestStreamCoalescesBursts: the first change of a quiet stream is sent at once; a burst of 500
// within the debounce window becomes ONE more refresh, at the window's end. Without the window
// each of the 500 would be a refresh (a page fetching itself 500 times).
func TestStreamCoalescesBursts(t *testing.T) {
	ht := NewManualTimers(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	h := upHub(ht)
	sub, err := h.Subscribe(Topic{Page: PagePayments}, h.Position().String())
	if err != nil {
		t.Fatal(err)
	}
	sink, _ := serve(t, ht, sub)

	h.publish(Event{Kind: KindSession, Session: "s-1", Status: "Registered"})
	if got := sink.next(t); got != "refresh "+h.Position().String() {
		t.Fatalf("first write %q, want an immediate refresh at %s", got, h.Position())
	}
	for i := range 500 {
		h.publish(Event{Kind: KindSession, Session: "s-" + strconv.Itoa(i), Status: "Completed"})
	}
	sink.quiet(t, ht, sub) // the burst is held: nothing went out yet
	if ht.Armed() < 2 {    // the lifetime and the debounce window
		t.Fatalf("no debounce window armed")
	}
	ht.Advance(time.Second)
	if got := sink.next(t); got != "refresh "+h.Position().String() {
		t.Fatalf("after the window: %q, want one refresh at %s", got, h.Position())
	}
	sink.quiet(t, ht, sub)

	// A change for a page that does not show it (the ledger) reaches nobody here.
	h.publish(Event{Kind: KindLedger, Session: "s-1"})
	sink.quiet(t, ht, sub)
}

// TestStreamDownAndBack: a dropped listener tells the page to poll (once, however often it is
// told), changes queued before the drop are dropped with it, and the listener's return is one
// refresh.
func TestStreamDownAndBack(t *testing.T) {
	ht := NewManualTimers(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	h := upHub(ht)
	sub, err := h.Subscribe(Topic{Page: PagePayment, Session: "s-1"}, h.Position().String())
	if err != nil {
		t.Fatal(err)
	}
	sink, _ := serve(t, ht, sub)
	h.publish(Event{Kind: KindCall, Session: "s-2"}) // another payment's: not for this page
	sink.quiet(t, ht, sub)

	h.publish(Event{Kind: KindCall, Session: "s-1"})
	if got := sink.next(t); got[:7] != "refresh" {
		t.Fatalf("got %q, want a refresh", got)
	}
	h.setDown()
	h.setDown()
	if got := sink.next(t); got != "down" {
		t.Fatalf("got %q, want down", got)
	}
	sink.quiet(t, ht, sub)
	h.setUp()
	ht.Advance(time.Second) // past any window
	if got := sink.next(t); got != "refresh "+h.Position().String() {
		t.Fatalf("got %q, want a refresh at the new generation %s", got, h.Position())
	}
}

// TestSubscribeCatchesUp: a page rendered at position P subscribes a moment later. A change it
// shows that happened in between is a refresh at once; a change it does not show is not; a
// position from another hub or generation, or none, is a refresh (cannot tell).
func TestSubscribeCatchesUp(t *testing.T) {
	ht := NewManualTimers(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	h := upHub(ht)
	rendered := h.Position().String()
	h.publish(Event{Kind: KindCall, Session: "s-other"})
	h.publish(Event{Kind: KindLedger, Session: "s-1"})

	for _, c := range []struct {
		name  string
		topic Topic
		since string
		want  bool
	}{
		{"payment page, a change of another payment", Topic{Page: PagePayment, Session: "s-9"}, rendered, false},
		{"payment page, its own ledger entry", Topic{Page: PagePayment, Session: "s-1"}, rendered, true},
		{"payments list, no session change", Topic{Page: PagePayments}, rendered, false},
		{"ledger page", Topic{Page: PageLedger}, rendered, true},
		{"up to date", Topic{Page: PageLedger}, h.Position().String(), false},
		{"no position", Topic{Page: PagePayments}, "", true},
		{"another replica's position", Topic{Page: PagePayments}, "beef0000-1-2", true},
		{"an earlier generation", Topic{Page: PagePayments}, Position{hub: h.nonce, gen: 0, seq: 2}.String(), true},
	} {
		sub, err := h.Subscribe(c.topic, c.since)
		if err != nil {
			t.Fatal(err)
		}
		got := len(sub.wake) == 1 && sub.take().Refresh
		if got != c.want {
			t.Errorf("%s: refresh at subscribe = %v, want %v", c.name, got, c.want)
		}
		sub.Close()
	}
	// Older than the ring remembers: cannot tell, so refresh.
	old := h.Position().String()
	for range ringSize + 1 {
		h.publish(Event{Kind: KindLedger})
	}
	sub, _ := h.Subscribe(Topic{Page: PagePayments}, old)
	if len(sub.wake) != 1 || !sub.take().Refresh {
		t.Errorf("a position older than the ring: no refresh")
	}
	sub.Close()
}

// TestSlowSubscriberCostsNothing: a subscriber that never looks holds one folded Pending, not a
// queue: 10 000 events later the listener never waited, another subscriber of the same topic
// heard them, and the slow one finds one count and the latest event when it finally looks.
func TestSlowSubscriberCostsNothing(t *testing.T) {
	h := upHub(NewManualTimers(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)))
	slow, _ := h.Subscribe(Topic{Page: PagePayments}, h.Position().String())
	fast, _ := h.Subscribe(Topic{Page: PagePayments}, h.Position().String())
	heard := 0
	for i := range 10000 {
		h.publish(Event{Kind: KindSession, Session: "s-" + strconv.Itoa(i)}) // never blocks
		p, err := fast.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		heard += p.Changes
	}
	if heard != 10000 {
		t.Fatalf("the fast subscriber heard %d changes, want 10000", heard)
	}
	p, err := slow.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p.Changes != 10000 || p.Last.Session != "s-9999" {
		t.Fatalf("the slow subscriber found %+v, want 10000 changes, the last s-9999", p)
	}
}

// TestUnsubscribeFreesEntries: the fan-out map has an entry per watched topic only while
// someone watches it; Close removes the subscription and, with the last one, the entry.
func TestUnsubscribeFreesEntries(t *testing.T) {
	h := upHub(NewManualTimers(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)))
	var subs []*Subscription
	for i := range 100 {
		for range 2 {
			s, err := h.Subscribe(Topic{Page: PagePayment, Session: "s-" + strconv.Itoa(i)}, "")
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, s)
		}
	}
	if n, topics := h.Stats(); n != 200 || topics != 100 {
		t.Fatalf("stats %d subscriptions, %d topics; want 200, 100", n, topics)
	}
	for _, s := range subs {
		s.Close()
		s.Close() // idempotent
	}
	if n, topics := h.Stats(); n != 0 || topics != 0 {
		t.Fatalf("after closing every subscription: %d subscriptions, %d topics left", n, topics)
	}
	h.publish(Event{Kind: KindSession, Session: "s-1"}) // nobody to tell; nothing grows
	if _, topics := h.Stats(); topics != 0 {
		t.Fatalf("publishing grew the map")
	}
}

// TestCloseEndsStreams: closing the hub (shutdown) ends every stream with ErrClosed and
// refuses new subscriptions.
func TestCloseEndsStreams(t *testing.T) {
	ht := NewManualTimers(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	h := upHub(ht)
	sub, _ := h.Subscribe(Topic{Page: PageDashboard}, h.Position().String())
	_, done := serve(t, ht, sub)
	h.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("stream ended with %v, want ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end when the hub closed")
	}
	if _, err := h.Subscribe(Topic{Page: PageDashboard}, ""); !errors.Is(err, ErrClosed) {
		t.Fatalf("subscribe after close: %v, want ErrClosed", err)
	}
	if n, topics := h.Stats(); n != 0 || topics != 0 {
		t.Fatalf("after close: %d subscriptions, %d topics", n, topics)
	}
}

// TestStreamLifetime: a stream ends by itself after its lifetime (the browser reconnects).
func TestStreamLifetime(t *testing.T) {
	ht := NewManualTimers(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	h := upHub(ht)
	sub, _ := h.Subscribe(Topic{Page: PageLocks}, h.Position().String())
	_, done := serve(t, ht, sub)
	ht.Advance(time.Hour)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stream ended with %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream outlived its lifetime")
	}
}

func TestTopics(t *testing.T) {
	if (Topic{Page: PagePayment}).Valid() || (Topic{Page: PageLocks, Session: "x"}).Valid() || (Topic{Page: "nope"}).Valid() {
		t.Fatal("invalid topics accepted")
	}
	// Every kind the triggers send reaches at least its payment's page.
	for _, k := range []Kind{KindSession, KindCall, KindCancel, KindRefund, KindCase, KindResolution, KindLedger, KindClaim} {
		if !(Topic{Page: PagePayment, Session: "s"}).Shows(Event{Kind: k, Session: "s"}) {
			t.Errorf("the payment page does not show %s", k)
		}
	}
}

// TestPaymentPageHearsItsOrder: the payment page shows its order's state and the order's other
// sessions, so a state change of another session of its order refreshes it, whether it comes
// while the page is open or between its render and its stream (the ring). What broke (an
// outside review): only its own session's events matched, and the page of a declined session
// never showed that the customer had paid the order with a new one. Its own session's change
// counts once (it is reached by its session and by its order); another session's gateway call
// and another order's sessions are nothing to it. Negative control: with Shows and publish
// matching the session alone, the other session's change is not heard.
func TestPaymentPageHearsItsOrder(t *testing.T) {
	h := upHub(NewManualTimers(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)))
	rendered := h.Position().String()
	h.publish(Event{Kind: KindSession, Session: "s-2", Order: "o-1", Status: "Registered"})
	late, _ := h.Subscribe(Topic{Page: PagePayment, Session: "s-1", Order: "o-1"}, rendered)
	if len(late.wake) != 1 || !late.take().Refresh {
		t.Error("a change of another session of the order between render and stream: no refresh")
	}
	late.Close()

	sub, _ := h.Subscribe(Topic{Page: PagePayment, Session: "s-1", Order: "o-1"}, h.Position().String())
	h.publish(Event{Kind: KindCall, Session: "s-2"})                                       // the other session's call
	h.publish(Event{Kind: KindSession, Session: "s-3", Order: "o-2", Status: "Completed"}) // another order
	if p, ok := sub.TryNext(); ok {
		t.Fatalf("the page heard what it does not show: %+v", p)
	}
	h.publish(Event{Kind: KindSession, Session: "s-2", Order: "o-1", Status: "Completed"})
	if p, ok := sub.TryNext(); !ok || p.Changes != 1 || p.Last.Session != "s-2" {
		t.Fatalf("another session of the order completed: %+v, %v; want one change", p, ok)
	}
	h.publish(Event{Kind: KindSession, Session: "s-1", Order: "o-1", Status: "Failed"})
	if p, ok := sub.TryNext(); !ok || p.Changes != 1 {
		t.Fatalf("its own session's change: %+v, %v; want it counted once", p, ok)
	}
	sub.Close()
	if n, topics := h.Stats(); n != 0 || topics != 0 {
		t.Fatalf("after close: %d subscriptions, %d fan-out entries", n, topics)
	}
	if (Topic{Page: PagePayments, Order: "o-1"}).Valid() {
		t.Fatal("an order on a page other than the payment page was accepted")
	}
}
