package payments_test

import (
	"context"
	"errors"
	"strings"
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
	return feedAllOf(t, svc.Feed, after, limit, want)
}

// feedAllOf is feedAll over another read of the feed (a payment's: PaymentFeed).
func feedAllOf(t *testing.T, read func(ctx context.Context, after string, limit int) (payments.FeedPage, error), after string, limit, want int) ([]payments.FeedEvent, string) {
	t.Helper()
	var got []payments.FeedEvent
	deadline := time.Now().Add(60 * time.Second)
	for len(got) < want {
		page, err := read(context.Background(), after, limit)
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
		if got := (change{e.OrderID, payments.Status(e.From), payments.Status(e.To)}); got != wantOrder[i] {
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
	// A new reader that wants only what happens from now on starts at the end.
	if page, err := b.svc.Feed(context.Background(), payments.FeedEnd, 10); err != nil || len(page.Events) != 0 || page.More || page.Next != end {
		t.Fatalf("the end: %+v, %v; want no events and %q", page, err, end)
	}
	later := b.registered(t, "o-feed-3", 300)
	if got, _ := feedAll(t, b.svc, end, payments.MaxFeedRead, 2); got[0].SessionID != later.ID || got[1].SessionID != later.ID {
		t.Fatalf("after the end: %+v", got)
	}
	// The largest cursor there can be: a transaction id this database never handed out, so a
	// cursor of another history (a restore rewound it): EEXPIRED, not an empty page.
	if page, err := b.svc.Feed(context.Background(), "18446744073709551615-9223372036854775807", 10); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("after the largest cursor: %+v, %v; want expired", page, err)
	}
	// A cursor of a lost history that the new history's transaction ids have passed: its
	// transaction id is one this database handed out (the first event's), but no event of it
	// has its id. Read on, it would sort among this history's events and skip those before it
	// without a word (the known gap of the check above, closed): EEXPIRED on every read, the
	// payment's feed too.
	xid, _, _ := strings.Cut(all[0].Cursor, "-")
	lost := xid + "-9223372036854775807"
	if page, err := b.svc.Feed(context.Background(), lost, 10); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("after a cursor of another history whose transaction id this one passed: %d events, %v; want expired", len(page.Events), err)
	}
	if page, err := b.svc.PaymentFeed(context.Background(), later.ID, lost, 10); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("a payment's feed after a cursor of another history: %d events, %v; want expired", len(page.Events), err)
	}
	// Every cursor the feed gave reads on, in the whole feed and in a payment's.
	for _, e := range all {
		if _, err := b.svc.Feed(context.Background(), e.Cursor, 10); err != nil {
			t.Fatalf("after %s: %v", e.Cursor, err)
		}
		if _, err := b.svc.PaymentFeed(context.Background(), later.ID, e.Cursor, 10); err != nil {
			t.Fatalf("payment feed after %s: %v", e.Cursor, err)
		}
	}
}

// The race the feed's order exists for. A Check completing payment A has written its timeline
// row (its id taken) and is parked before its commit, in the same transaction's ledger entry:
// the test holds ledger_day_deltas, which the entry's trigger writes, in SHARE mode, and
// pg_blocking_pids shows the wait. (Not accounting_entries itself: a statement not yet prepared
// on the connection takes its table's lock when pgx prepares the batch, before the transition
// runs.) Meanwhile payment B is created and committed, and a refund of payment C: their rows
// have larger ids than A's uncommitted one. A reader then must be given nothing past A: had it
// been given B's rows or C's refund, its cursor would pass A's id and A's completion — the one
// change a shop waits for — would never reach it. Once A commits, the reader gets A's Completed,
// then B's rows, then the refund's, each once.
// Negative controls (run by hand): ordering by id alone without the xmin bound gives the reader
// B's rows while A is open, and A's Completed never; the refunds' branch without the bound gives
// it the refund.
func TestFeedWaitsForATransitionStillOpen(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	a := b.registered(t, "o-feed-a", 2500)
	b.gw.SetStatus(a.GatewayPaymentID, payments.GatewaySucceeded)
	c := b.completed(t, "o-feed-c", 900)
	_, start := feedAll(t, b.svc, "", payments.MaxFeedRead, 5)

	holder, holderPID := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `LOCK TABLE ledger_day_deltas IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	check := goCheck(b.svc, a.ID)
	waitBlockedBy(t, b.pool, holderPID) // A's transition is written, its ledger entry waits

	bSess := b.registered(t, "o-feed-b", 800) // committed while A is open
	b.gw.SetRefundOutcome("pending")          // (a refund that succeeds would write the ledger too, and wait)
	refund := b.refundIn(t, c, 400, "k-c")
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
	got, _ := feedAll(t, b.svc, start, payments.MaxFeedRead, 4)
	if got[0].SessionID != a.ID || payments.Status(got[0].To) != payments.StatusCompleted ||
		got[1].SessionID != bSess.ID || payments.Status(got[1].To) != payments.StatusRegistering ||
		got[2].SessionID != bSess.ID || payments.Status(got[2].To) != payments.StatusRegistered ||
		got[3].RefundID != refund.ID || got[3].To != payments.RefundPending {
		t.Fatalf("after A committed the feed gave %+v", got)
	}
	// The interleaving really happened: A's row took its id before B's rows took theirs.
	if n := b.count(t, `SELECT count(*) FROM session_events a, session_events b
		WHERE a.session_id = $1 AND a.to_status = 'Completed' AND b.session_id = $2 AND a.id < b.id`, a.ID, bSess.ID); n != 2 {
		t.Fatalf("A's Completed row is older than %d of B's 2 rows, want both", n)
	}
	if n := b.count(t, `SELECT count(*) FROM session_events a, refund_events r
		WHERE a.session_id = $1 AND a.to_status = 'Completed' AND r.refund_id = $2 AND a.id < r.id`, a.ID, refund.ID); n != 1 {
		t.Fatal("A's Completed row is not older than the refund's")
	}
}

// A refund's status changes are in the feed beside its payment's, in the order they committed:
// its claim as Pending and its outcome, each once, with the refund's id and amount and who
// caused it (the request that made it when the gateway answered at once, the patrol when the
// patrol's drive settled it). A refund the gateway refuses ends Failed in the feed.
func TestFeedCarriesRefunds(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	paid := b.completed(t, "o-feed-refund", 1000)
	_, start := feedAll(t, b.svc, "", payments.MaxFeedRead, 3)

	at := b.refundIn(t, paid, 300, "k-at-once")
	b.gw.SetRefundOutcome("pending")
	later := b.refundIn(t, paid, 200, "k-later")
	b.gw.SetRefundOutcome("failed")
	refused := b.refundIn(t, paid, 100, "k-refused")
	b.gw.SetRefundOutcome("succeeded")
	b.gw.SetRefundStatus(paid.GatewayPaymentID, "succeeded")
	b.clock.Advance(time.Minute)
	if n, err := b.svc.DriveRefunds(ctx); err != nil || n != 1 {
		t.Fatalf("the patrol drove %d refunds, %v", n, err)
	}

	got, end := feedAll(t, b.svc, start, payments.MaxFeedRead, 6)
	type change struct {
		refund   string
		amount   int64
		from, to string
		by       payments.ActorKind
	}
	want := []change{
		{at.ID, 300, "", payments.RefundPending, payments.ActorAPI}, {at.ID, 300, payments.RefundPending, payments.RefundSucceeded, payments.ActorAPI},
		{later.ID, 200, "", payments.RefundPending, payments.ActorAPI},
		{refused.ID, 100, "", payments.RefundPending, payments.ActorAPI}, {refused.ID, 100, payments.RefundPending, payments.RefundFailed, payments.ActorAPI},
		{later.ID, 200, payments.RefundPending, payments.RefundSucceeded, payments.ActorSweeper},
	}
	for i, e := range got {
		if c := (change{e.RefundID, e.Amount, e.From, e.To, e.By}); c != want[i] {
			t.Fatalf("event %d = %+v, want %+v", i, c, want[i])
		}
		if e.Type != payments.FeedEventRefundStatus || e.SessionID != paid.ID || e.OrderID != paid.OrderID || e.Currency != paid.Currency {
			t.Fatalf("event %d = %+v, not a refund of %+v", i, e, paid)
		}
	}
	// As JSON (GET /api/v1/events, the events webhook): the refund's id and its own link.
	body := payments.FeedPage{Events: got[1:2], Next: end}.Body().Data[0]
	if body.Type != "refund.status_changed" || body.RefundID != at.ID || body.PaymentID != paid.ID ||
		body.Links.Self != "/api/v1/refunds/"+at.ID || body.FromStatus == nil || *body.FromStatus != "Pending" || body.Status != "Succeeded" {
		t.Fatalf("as JSON: %+v", body)
	}
	if page, err := b.svc.Feed(ctx, end, 10); err != nil || len(page.Events) != 0 {
		t.Fatalf("after the end: %+v, %v", page, err)
	}
}

func (b *bench) refundIn(t *testing.T, paid payments.Session, amount int64, key string) payments.Refund {
	t.Helper()
	r, err := b.svc.CreateRefund(context.Background(), api, payments.RefundInput{PaymentID: paid.ID, Amount: amount, RequestKey: key})
	if err != nil {
		t.Fatalf("refund %d: %v", amount, err)
	}
	return r.Refund
}

// One payment's part of the feed (GET /api/v1/payments/{id}/events): exactly the feed's events
// of that payment — its own changes and its refunds', none of another payment's — in the feed's
// order, with the feed's cursors, page by page as whole. A cursor from the whole feed reads on in
// the payment's, the end included. An unknown payment is ENOTFOUND, a bad cursor or limit
// EINVALID.
// Negative controls (run by hand): without the payment filter in the refunds' branch the
// payment's list carries the other payment's refund; without it in the payments' branch, the
// other payment's changes.
func TestPaymentFeedIsThePaymentsPartOfTheFeed(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	a := b.completed(t, "o-pfeed-a", 1000)
	other := b.completed(t, "o-pfeed-b", 800)
	b.refundIn(t, other, 100, "k-b")
	b.refundIn(t, a, 300, "k-a")
	b.gw.SetRefundOutcome("failed")
	b.refundIn(t, a, 200, "k-a2")

	all, end := feedAll(t, b.svc, "", payments.MaxFeedRead, 3+3+2+2+2)
	var want []payments.FeedEvent
	for _, e := range all {
		if e.SessionID == a.ID {
			want = append(want, e)
		}
	}
	if len(want) != 3+2+2 {
		t.Fatalf("the feed has %d events of payment A, want 7: %+v", len(want), all)
	}
	ofA := func(ctx context.Context, after string, limit int) (payments.FeedPage, error) {
		return b.svc.PaymentFeed(ctx, a.ID, after, limit)
	}
	for _, limit := range []int{payments.MaxFeedRead, 1, 3} {
		got, next := feedAllOf(t, ofA, "", limit, len(want))
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("limit %d: event %d = %+v, want %+v", limit, i, got[i], want[i])
			}
		}
		if next != want[len(want)-1].Cursor {
			t.Fatalf("limit %d: next %q, want the last event's %q", limit, next, want[len(want)-1].Cursor)
		}
		if page, err := b.svc.PaymentFeed(ctx, a.ID, next, limit); err != nil || len(page.Events) != 0 || page.More || page.Next != next {
			t.Fatalf("limit %d: after the payment's last event: %+v, %v", limit, page, err)
		}
	}
	// The whole feed's cursors read on: from A's first refund event, A's later ones only.
	if got, _ := feedAllOf(t, ofA, want[2].Cursor, 10, 4); got[0] != want[3] || got[3] != want[6] {
		t.Fatalf("after %s: %+v", want[2].Cursor, got)
	}
	// From the end: nothing, the whole feed's end; then A's next change and not B's.
	page, err := b.svc.PaymentFeed(ctx, a.ID, payments.FeedEnd, 10)
	if err != nil || len(page.Events) != 0 || page.Next != end {
		t.Fatalf("the end: %+v, %v; want no events and %q", page, err, end)
	}
	b.gw.SetRefundOutcome("succeeded")
	b.refundIn(t, other, 50, "k-b2")
	last := b.refundIn(t, a, 100, "k-a3")
	if got, _ := feedAllOf(t, ofA, end, 10, 2); got[0].RefundID != last.ID || got[1].RefundID != last.ID || got[1].To != payments.RefundSucceeded {
		t.Fatalf("after the end: %+v", got)
	}

	for _, id := range []string{"6f1c2c3e-0000-4000-8000-000000000000", "not-a-uuid", ""} {
		if _, err := b.svc.PaymentFeed(ctx, id, "", 10); payments.ErrorCode(err) != payments.ENOTFOUND {
			t.Fatalf("PaymentFeed(%q) = %v, want ENOTFOUND", id, err)
		}
	}
	for _, bad := range []struct {
		after string
		limit int
		field string
	}{{"x", 10, "after"}, {"1-2-3", 10, "after"}, {"", 0, "limit"}, {"", payments.MaxFeedRead + 1, "limit"}} {
		_, err := b.svc.PaymentFeed(ctx, a.ID, bad.after, bad.limit)
		var e *payments.Error
		if payments.ErrorCode(err) != payments.EINVALID || !errors.As(err, &e) || e.Field != bad.field {
			t.Fatalf("PaymentFeed(%q, %d) = %v, want EINVALID on %s", bad.after, bad.limit, err, bad.field)
		}
	}
}
