package payments_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"pitlane/payments"
)

// feedAll reads the feed after cursor, page by page, until it has want events, and returns them
// with the last cursor. It reads again when the feed has fewer: the feed lags behind the oldest
// transaction still writing anywhere in the cluster, and other tests share this one (the
// deadline is for a failing test only: a passing read returns as soon as the events are there).
func feedAll(t *testing.T, svc *payments.Service, after string, limit, want int) ([]payments.FeedEvent, string) {
	t.Helper()
	var got []payments.FeedEvent
	deadline := time.Now().Add(60 * time.Second)
	for len(got) < want {
		page, err := svc.Feed(context.Background(), after, limit)
		if err != nil {
			t.Fatalf("Feed(%q, %d): %v", after, limit, err)
		}
		if len(page.Events) > limit || (page.More && len(page.Events) != limit) {
			t.Fatalf("Feed(%q, %d) = %d events, more %v", after, limit, len(page.Events), page.More)
		}
		got = append(got, page.Events...)
		if len(page.Events) == 0 && time.Now().After(deadline) {
			t.Fatalf("the feed gave %d events, want %d", len(got), want)
		}
		after = page.Next
	}
	if len(got) != want {
		t.Fatalf("the feed gave %d events, want %d: %+v", len(got), want, got)
	}
	return got, after
}

// Every status change is in the feed once, in its transaction's order, with the payment it
// belongs to; a reader paging one event at a time sees the same as one reading all at once, and
// a cursor at the end answers nothing new and itself back.
func TestFeedPagesEveryChangeOnce(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	paid := b.registered(t, "o-feed-1", 1500)
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.plain.Check(context.Background(), api, paid.ID); err != nil {
		t.Fatal(err)
	}
	declined := b.registered(t, "o-feed-2", 700)
	b.gw.SetStatus(declined.GatewayPaymentID, payments.GatewayDeclined)
	if _, err := b.plain.Check(context.Background(), api, declined.ID); err != nil {
		t.Fatal(err)
	}
	want := b.count(t, `SELECT count(*) FROM session_events`)
	if want != 6 { // Registering, Registered, Completed; Registering, Registered, Failed
		t.Fatalf("session_events = %d, want 6", want)
	}
	all, end := feedAll(t, b.svc, "", payments.MaxFeedRead, want)
	one, end1 := feedAll(t, b.svc, "", 1, want)
	for i := range all {
		if all[i] != one[i] {
			t.Fatalf("event %d: %+v read whole, %+v read one by one", i, all[i], one[i])
		}
	}
	if end != end1 || end != all[len(all)-1].Cursor {
		t.Fatalf("ends %q and %q, last event %q", end, end1, all[len(all)-1].Cursor)
	}
	type change struct {
		order    string
		from, to payments.Status
	}
	wantOrder := []change{
		{"o-feed-1", "", payments.StatusRegistering}, {"o-feed-1", payments.StatusRegistering, payments.StatusRegistered},
		{"o-feed-1", payments.StatusRegistered, payments.StatusCompleted},
		{"o-feed-2", "", payments.StatusRegistering}, {"o-feed-2", payments.StatusRegistering, payments.StatusRegistered},
		{"o-feed-2", payments.StatusRegistered, payments.StatusFailed},
	}
	for i, e := range all {
		if got := (change{e.OrderID, e.From, e.To}); got != wantOrder[i] {
			t.Fatalf("event %d = %+v, want %+v", i, got, wantOrder[i])
		}
		if sess := map[string]payments.Session{"o-feed-1": paid, "o-feed-2": declined}[e.OrderID]; e.SessionID != sess.ID || e.Amount != sess.Amount || e.Currency != sess.Currency {
			t.Fatalf("event %d = %+v, not of %+v", i, e, sess)
		}
		if e.By != payments.ActorAPI || !e.At.Equal(t0) {
			t.Fatalf("event %d by %q at %v", i, e.By, e.At)
		}
	}
	page, err := b.svc.Feed(context.Background(), end, 10)
	if err != nil || len(page.Events) != 0 || page.More || page.Next != end {
		t.Fatalf("after the end: %+v, %v", page, err)
	}
	for _, bad := range []struct {
		after string
		limit int
		field string
	}{
		{"x", 10, "after"}, {"12", 10, "after"}, {"12-", 10, "after"}, {"-1-2", 10, "after"}, {"1-2-3", 10, "after"},
		{"18446744073709551616-1", 10, "after"}, {"1-9223372036854775808", 10, "after"}, {" 1-2", 10, "after"}, {"1-+2", 10, "after"}, {"+1-2", 10, "after"},
		{"", 0, "limit"}, {"", payments.MaxFeedRead + 1, "limit"}, {"", -1, "limit"},
	} {
		_, err := b.svc.Feed(context.Background(), bad.after, bad.limit)
		var e *payments.Error
		if payments.ErrorCode(err) != payments.EINVALID || !errors.As(err, &e) || e.Field != bad.field {
			t.Fatalf("Feed(%q, %d) = %v, want EINVALID on %s", bad.after, bad.limit, err, bad.field)
		}
	}
	// The largest cursor there can be: nothing after it, no error.
	if page, err := b.svc.Feed(context.Background(), "18446744073709551615-9223372036854775807", 10); err != nil || len(page.Events) != 0 {
		t.Fatalf("after the largest cursor: %+v, %v", page, err)
	}
}

// The race the feed's order exists for. A Check completing payment A has written its timeline
// row (its id taken) and is parked before its commit, in the same transaction's ledger entry:
// the test holds ledger_day_deltas, which the entry's trigger writes, in SHARE mode, and
// pg_blocking_pids shows the wait. (Not accounting_entries itself: a statement not yet prepared
// on the connection takes its table's lock when pgx prepares the batch, before the transition
// runs.) Meanwhile payment B is created and committed: its rows have larger ids than A's
// uncommitted one. A reader then must be given nothing past A: had it been given B's rows, its
// cursor would pass A's id and A's completion — the one change a shop waits for — would never
// reach it. Once A commits, the reader gets A's Completed and then B's rows, each once.
// Negative control (run by hand): ordering by id alone without the xmin bound gives the reader
// B's rows while A is open, and A's Completed never.
func TestFeedWaitsForATransitionStillOpen(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	a := b.registered(t, "o-feed-a", 2500)
	b.gw.SetStatus(a.GatewayPaymentID, payments.GatewaySucceeded)
	_, start := feedAll(t, b.svc, "", payments.MaxFeedRead, 2)

	holder, holderPID := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `LOCK TABLE ledger_day_deltas IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	check := goCheck(b.svc, a.ID)
	waitBlockedBy(t, b.pool, holderPID) // A's transition is written, its ledger entry waits

	bSess := b.registered(t, "o-feed-b", 800) // committed while A is open
	page, err := b.svc.Feed(ctx, start, payments.MaxFeedRead)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 0 || page.Next != start {
		t.Fatalf("while A's completion is open the feed gave %+v: a reader's cursor would pass A's row", page.Events)
	}

	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := mustWait(t, check, "A's check"); r.err != nil || r.s.Status != payments.StatusCompleted {
		t.Fatalf("check A = %s, %v", r.s.Status, r.err)
	}
	got, _ := feedAll(t, b.svc, start, payments.MaxFeedRead, 3)
	if got[0].SessionID != a.ID || got[0].To != payments.StatusCompleted ||
		got[1].SessionID != bSess.ID || got[1].To != payments.StatusRegistering ||
		got[2].SessionID != bSess.ID || got[2].To != payments.StatusRegistered {
		t.Fatalf("after A committed the feed gave %+v", got)
	}
	// The interleaving really happened: A's row took its id before B's rows took theirs.
	if n := b.count(t, `SELECT count(*) FROM session_events a, session_events b
		WHERE a.session_id = $1 AND a.to_status = 'Completed' AND b.session_id = $2 AND a.id < b.id`, a.ID, bSess.ID); n != 2 {
		t.Fatalf("A's Completed row is older than %d of B's 2 rows, want both", n)
	}
}
