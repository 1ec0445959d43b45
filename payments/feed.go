package payments

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The events feed: every status change of every payment (the timeline's rows, session_events)
// and of every refund (refund_events, migration 00212), for a shop that follows its payments from one place instead of polling each order. A reader
// keeps the cursor of the last event it handled and asks for what came after it.
//
// The order is the writing transaction's id (xid8), then the row's id within it, and the feed
// serves only rows whose transaction is older than the oldest transaction still running
// (migration 00210 says why ids alone would let a reader skip a row for ever). So a cursor is
// final: nothing ever appears before it. The price: the feed lags behind the oldest transaction
// still writing in the cluster (normally milliseconds; a transaction left open holds the feed
// back until it ends, and loses nothing).

// FeedEvent is one status change of a payment or of a refund.
type FeedEvent struct {
	// Cursor names this event in the feed: "<transaction id>-<row id>". Opaque to readers.
	Cursor string
	// Type is FeedEventPaymentStatus or FeedEventRefundStatus.
	Type      string
	SessionID string
	OrderID   string
	// RefundID: the refund whose status changed (refund events only).
	RefundID string
	// Amount and Currency are the payment's, or the refund's for a refund event.
	Amount   int64
	Currency string
	// From and To are payment statuses (Status), or refund statuses (RefundPending, …) for a
	// refund event. From is "" for the first state.
	From string
	To   string
	By   ActorKind
	At   time.Time
}

// FeedPage is one read of the feed.
type FeedPage struct {
	Events []FeedEvent
	// Next is the cursor to read after: the last event's, or the cursor read after when there
	// were none (so a reader can always pass it back).
	Next string
	// More: other events were ready after these.
	More bool
}

// MaxFeedRead bounds one read of the feed; DefaultFeedRead is the size of a read that
// names none.
const (
	MaxFeedRead     = 1000
	DefaultFeedRead = 100
)

// FeedEnd, passed as Feed's after, reads no event and answers the feed's end as the cursor to
// read after: a new reader that wants what happens from now on, not the history.
const FeedEnd = "end"

// Feed returns up to limit events after the cursor after ("" reads from the feed's start;
// FeedEnd answers none, with the feed's end as Next), oldest first. A malformed cursor or a
// limit outside 1..MaxFeedRead is EINVALID naming the field ("after", "limit").
func (s *Service) Feed(ctx context.Context, after string, limit int) (FeedPage, error) {
	if limit < 1 || limit > MaxFeedRead {
		return FeedPage{}, Invalid("limit", "limit must be between 1 and %d", MaxFeedRead)
	}
	return s.readFeed(ctx, feedSQL, after, limit)
}

// PaymentFeed returns up to limit of one payment's events (its own status changes and its
// refunds') after the cursor after ("" from its first), oldest first: the feed's events of that
// payment, with the feed's cursors, so a cursor from either reads on in this one. An unknown
// payment is ENOTFOUND; the rest is as in Feed (FeedEnd: the whole feed's end, after which
// this payment's next change comes).
func (s *Service) PaymentFeed(ctx context.Context, paymentID, after string, limit int) (FeedPage, error) {
	if limit < 1 || limit > MaxFeedRead {
		return FeedPage{}, Invalid("limit", "limit must be between 1 and %d", MaxFeedRead)
	}
	if _, err := s.Get(ctx, paymentID); err != nil {
		return FeedPage{}, err
	}
	return s.readFeed(ctx, paymentFeedSQL, after, limit, paymentID)
}

// readFeed runs a feed read (feedSQL or paymentFeedSQL, with more arguments after the
// cursor's and the limit's) after the cursor after, limit having been checked.
func (s *Service) readFeed(ctx context.Context, sql, after string, limit int, more ...any) (FeedPage, error) {
	if after == FeedEnd {
		var end string
		if err := s.db.QueryRow(ctx, feedEndSQL).Scan(&end); err != nil {
			return FeedPage{}, dbError("events: end", err, "")
		}
		return FeedPage{Events: []FeedEvent{}, Next: end}, nil
	}
	xid, id, err := parseFeedCursor(after)
	if err != nil {
		return FeedPage{}, err
	}
	// The read and, for a cursor, whether it is of this history (cursorHistorySQL), in one
	// round trip.
	var events []FeedEvent
	history := ""
	var b pgx.Batch
	b.Queue(sql, append([]any{xid, id, limit + 1}, more...)...).Query(func(rows pgx.Rows) error {
		var err error
		events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (FeedEvent, error) {
			var e FeedEvent
			var by string
			err := r.Scan(&e.Cursor, &e.Type, &e.SessionID, &e.RefundID, &e.OrderID, &e.Amount, &e.Currency, &e.From, &e.To, &by, &e.At)
			e.By = ActorKind(by)
			return e, err
		})
		return err
	})
	if after != "" {
		b.Queue(cursorHistorySQL, xid, id).QueryRow(func(r pgx.Row) error { return r.Scan(&history) })
	}
	if err := s.db.SendBatch(ctx, &b).Close(); err != nil {
		return FeedPage{}, dbError("events", err, "")
	}
	if history != "" {
		return FeedPage{}, Errorf(EEXPIRED, "after names an event of a history this database does not have (%s): "+
			"read again from a cursor stored before the restore, or from after=%s, and compare your orders for the gap", history, FeedEnd)
	}
	page := FeedPage{Events: events, Next: after}
	if len(events) > limit {
		page.Events, page.More = events[:limit], true
	}
	if n := len(page.Events); n > 0 {
		page.Next = page.Events[n-1].Cursor
	}
	return page, nil
}

// cursorHistorySQL says whether a cursor ($1 its transaction id, $2 its event's id) is of a
// history this database does not have: ” when it is (or cannot be told yet), else why not. The
// feed only serves events of transactions older than every running one, so every cursor it
// gave names a transaction id below the next one, and an event that is still there (events are
// never deleted). After a restore to an earlier point (or the promotion of a standby that had
// not received the last transactions) transaction ids are handed out again from there, and a
// cursor of the lost history is either
//
//   - at or above the next transaction id: ids have not come back up to it yet; or
//   - below the oldest running one, naming an event that is not there: the new history's ids
//     have passed it — read on, it would sort among the new events and skip those before it
//     without a word.
//
// Its reader is told (EEXPIRED, 410) on every read. A cursor between the two (its transaction
// may still be running) cannot be told yet; nor can one whose (transaction id, event id) the
// new history happens to hand out again. Transaction id 0 is the feed's start, never an event's.
const cursorHistorySQL = `SELECT CASE
		WHEN $1::text::xid8 >= pg_snapshot_xmax(pg_current_snapshot())
			THEN 'its transaction id was not handed out yet: the database was restored to an earlier point since'
		WHEN $1::text::xid8 <> '0'::xid8 AND $1::text::xid8 < pg_snapshot_xmin(pg_current_snapshot())
			AND NOT EXISTS (SELECT 1 FROM session_events WHERE xid = $1::text::xid8 AND id = $2)
			AND NOT EXISTS (SELECT 1 FROM refund_events WHERE xid = $1::text::xid8 AND id = $2)
			THEN 'no such event: the database was restored to an earlier point since, and its new events passed the cursor'
		ELSE '' END`

// parseFeedCursor splits a cursor into feedSQL's $1 and $2 ("" is the feed's start);
// EINVALID on "after" when it is not one the feed gives.
func parseFeedCursor(after string) (xid string, id int64, err error) {
	if after == "" {
		return "0", 0, nil
	}
	x, i, ok := strings.Cut(after, "-")
	xv, errX := strconv.ParseUint(x, 10, 64)
	iv, errI := strconv.ParseUint(i, 10, 63) // a bigint, no sign
	if !ok || errX != nil || errI != nil {
		return "", 0, Invalid("after", "after must be the id of an event the feed returned (like 1234-5678), or %q for the feed's end", FeedEnd)
	}
	return strconv.FormatUint(xv, 10), int64(iv), nil
}

// feedServes is which event rows (alias e) the feed serves: those written since migrations
// 00210 and 00212 whose transaction is older than the oldest one still running.
const feedServes = `e.xid IS NOT NULL AND e.xid < pg_snapshot_xmin(pg_current_snapshot())`

// feedAfter is which event rows (alias e) come after the cursor $1 (its transaction id, text),
// $2 (its row id) in the feed's order. It names xid IS NOT NULL itself: session_events_feed is a
// partial index on it, which the planner cannot tell the row comparison implies (without it,
// eventsAfter read session_events whole on every stats scrape: an outside review).
const feedAfter = `e.xid IS NOT NULL AND (e.xid, e.id) > ($1::text::xid8, $2::bigint)`

// feedEvents is the feed's events, payments' and refunds', as one relation (alias ev: xid, id,
// type, session_id, refund_id, order_id, amount, currency, from_status, to_status, actor_kind,
// created_at) of at most 2 × limit rows: each table's events that match where (written over
// alias e: feedServes and a bound, for what the feed serves) and, when of is not "", belong to
// the payment of names (an SQL expression), in order (over e), the first limit of them. Each branch walks its own (xid, id)
// index (one payment's: its events and refunds by their own indexes); the caller orders and
// limits the two together. (One UNION ALL ordered once
// outside would sort both tables whole: PostgreSQL merges the branches of a UNION ALL in order
// only when they have no WHERE, and these have feedServes. TestFeedReadsByItsIndex.)
//
// One payment's branches have no order or limit of their own: a payment has a handful of
// events, found by its own indexes and sorted outside.
func feedEvents(where, of, order, limit string) string {
	sessionOf, refundOf := "", ""
	inner := ` ORDER BY ` + order + ` LIMIT ` + limit
	if of != "" {
		sessionOf, refundOf = ` AND e.session_id = `+of, ` AND f.session_id = `+of
		inner = ""
	}
	return `(
	(SELECT e.xid, e.id, '` + FeedEventPaymentStatus + `'::text AS type, e.session_id, ''::text AS refund_id, s.order_id, s.amount, s.currency,
		coalesce(e.from_status, '') AS from_status, e.to_status, e.actor_kind, e.created_at
	FROM session_events e JOIN payment_sessions s ON s.id = e.session_id
	WHERE ` + where + sessionOf + inner + `)
	UNION ALL
	(SELECT e.xid, e.id, '` + FeedEventRefundStatus + `'::text, f.session_id, f.id::text, f.order_id, f.amount, f.currency,
		coalesce(e.from_status, ''), e.to_status, e.actor_kind, e.created_at
	FROM refund_events e JOIN refunds f ON f.id = e.refund_id
	WHERE ` + where + refundOf + inner + `)
) ev`
}

// feedSQL reads the feed: $1 the cursor's transaction id (text: xid8 has no Go type in pgx),
// $2 its row id, $3 how many rows.
var feedSQL = feedRead(``)

// paymentFeedSQL reads one payment's part of the feed: feedSQL's arguments, and $4 the payment.
var paymentFeedSQL = feedRead(`$4::uuid`)

func feedRead(of string) string {
	from := feedEvents(feedServes+` AND `+feedAfter, of, `e.xid, e.id`, `$3`)
	if of != "" {
		// One payment's events are few: all of them first, by the payment's own indexes, then
		// ordered and cut. (The planner walks the feed's index instead only when the oldest
		// running transaction is older than the payment's events: it evaluates feedServes's
		// bound to estimate, and then that walk reads nothing. TestFeedReadsByItsIndex waits
		// for its fill to be served: waitServed.)
		from = `(SELECT * FROM ` + from + ` OFFSET 0) ev`
	}
	return `
	SELECT ev.xid::text || '-' || ev.id, ev.type, ev.session_id::text, ev.refund_id, ev.order_id, ev.amount, ev.currency,
		ev.from_status, ev.to_status, ev.actor_kind, ev.created_at
	FROM ` + from + `
	ORDER BY ev.xid, ev.id
	LIMIT $3`
}

// feedEndSQL is the feed's end: the cursor of the last event it serves (empty when it serves
// none). What is still being written sorts after it, so a reader starting there misses nothing
// from then on.
var feedEndSQL = `SELECT coalesce((SELECT ev.xid::text || '-' || ev.id FROM ` + feedEvents(feedServes, ``, `e.xid DESC, e.id DESC`, `1`) + `
	ORDER BY ev.xid DESC, ev.id DESC LIMIT 1), '')`

// FeedBody is the feed as JSON, the same for GET /api/v1/events and the events webhook: what a
// shop's reader parses once.
type FeedBody struct {
	Data       []FeedEventBody `json:"data"`
	NextCursor string          `json:"next_cursor"`
	HasMore    bool            `json:"has_more"`
}

// FeedEventBody is one event in FeedBody. Its id is the feed's cursor for it.
type FeedEventBody struct {
	ID         string    `json:"id"`
	Type       string    `json:"type"`
	PaymentID  string    `json:"payment_id"`
	RefundID   string    `json:"refund_id,omitempty"`
	OrderID    string    `json:"order_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	FromStatus *string   `json:"from_status"`
	Status     string    `json:"status"`
	By         string    `json:"by"`
	CreatedAt  time.Time `json:"created_at"`
	Links      struct {
		Self string `json:"self"`
	} `json:"links"`
}

// The types of the feed's events. Readers skip types they do not know, so others can be added.
const (
	FeedEventPaymentStatus = "payment.status_changed"
	FeedEventRefundStatus  = "refund.status_changed"
)

// Body is the page as the feed's JSON.
func (p FeedPage) Body() FeedBody {
	out := FeedBody{Data: make([]FeedEventBody, len(p.Events)), NextCursor: p.Next, HasMore: p.More}
	for i, e := range p.Events {
		b := FeedEventBody{ID: e.Cursor, Type: e.Type, PaymentID: e.SessionID, RefundID: e.RefundID, OrderID: e.OrderID,
			Amount: e.Amount, Currency: e.Currency, Status: e.To, By: string(e.By), CreatedAt: e.At.UTC()}
		if e.From != "" {
			from := e.From
			b.FromStatus = &from
		}
		b.Links.Self = "/api/v1/payments/" + e.SessionID
		if e.RefundID != "" {
			b.Links.Self = "/api/v1/refunds/" + e.RefundID
		}
		out.Data[i] = b
	}
	return out
}
