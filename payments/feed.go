package payments

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The events feed: every status change of every payment (the timeline's rows, session_events),
// for a shop that follows its payments from one place instead of polling each order. A reader
// keeps the cursor of the last event it handled and asks for what came after it.
//
// The order is the writing transaction's id (xid8), then the row's id within it, and the feed
// serves only rows whose transaction is older than the oldest transaction still running
// (migration 00210 says why ids alone would let a reader skip a row for ever). So a cursor is
// final: nothing ever appears before it. The price: the feed lags behind the oldest transaction
// still writing in the cluster (normally milliseconds; a transaction left open holds the feed
// back until it ends, and loses nothing).

// FeedEvent is one status change of a payment.
type FeedEvent struct {
	// Cursor names this event in the feed: "<transaction id>-<row id>". Opaque to readers.
	Cursor    string
	SessionID string
	OrderID   string
	Amount    int64
	Currency  string
	From      Status // "" for the session's first state
	To        Status
	By        ActorKind
	At        time.Time
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

// Feed returns up to limit events after the cursor after ("" reads from the feed's start),
// oldest first. A malformed cursor or a limit outside 1..MaxFeedRead is EINVALID naming the
// field ("after", "limit").
func (s *Service) Feed(ctx context.Context, after string, limit int) (FeedPage, error) {
	var xid, id uint64
	if after != "" {
		x, i, ok := strings.Cut(after, "-")
		var errX, errI error
		xid, errX = strconv.ParseUint(x, 10, 64)
		id, errI = strconv.ParseUint(i, 10, 63) // a bigint, no sign
		if !ok || errX != nil || errI != nil {
			return FeedPage{}, Invalid("after", "after must be the id of an event the feed returned (like 1234-5678)")
		}
	}
	if limit < 1 || limit > MaxFeedRead {
		return FeedPage{}, Invalid("limit", "limit must be between 1 and %d", MaxFeedRead)
	}
	rows, err := s.db.Query(ctx, feedSQL, strconv.FormatUint(xid, 10), int64(id), limit+1)
	if err != nil {
		return FeedPage{}, dbError("events", err, "")
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FeedEvent, error) {
		var e FeedEvent
		var from, to, by string
		err := r.Scan(&e.Cursor, &e.SessionID, &e.OrderID, &e.Amount, &e.Currency, &from, &to, &by, &e.At)
		e.From, e.To, e.By = Status(from), Status(to), ActorKind(by)
		return e, err
	})
	if err != nil {
		return FeedPage{}, dbError("events", fmt.Errorf("read: %w", err), "")
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

// feedServes is which timeline rows (alias e) the feed serves: those written since migration
// 00210 whose transaction is older than the oldest one still running.
const feedServes = `e.xid IS NOT NULL AND e.xid < pg_snapshot_xmin(pg_current_snapshot())`

// feedSQL reads the feed: $1 the cursor's transaction id (text: xid8 has no Go type in pgx),
// $2 its row id, $3 how many rows. It walks session_events_feed (migration 00210) from the
// cursor, the bound on the index's first column included (TestFeedReadsByItsIndex).
const feedSQL = `
	SELECT e.xid::text || '-' || e.id, e.session_id::text, s.order_id, s.amount, s.currency,
		coalesce(e.from_status, ''), e.to_status, e.actor_kind, e.created_at
	FROM session_events e JOIN payment_sessions s ON s.id = e.session_id
	WHERE ` + feedServes + `
	  AND (e.xid, e.id) > ($1::text::xid8, $2::bigint)
	ORDER BY e.xid, e.id
	LIMIT $3`

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

// FeedEventPaymentStatus is the one type of event the feed has today; readers skip types they
// do not know, so others can be added.
const FeedEventPaymentStatus = "payment.status_changed"

// Body is the page as the feed's JSON.
func (p FeedPage) Body() FeedBody {
	out := FeedBody{Data: make([]FeedEventBody, len(p.Events)), NextCursor: p.Next, HasMore: p.More}
	for i, e := range p.Events {
		b := FeedEventBody{ID: e.Cursor, Type: FeedEventPaymentStatus, PaymentID: e.SessionID, OrderID: e.OrderID,
			Amount: e.Amount, Currency: e.Currency, Status: string(e.To), By: string(e.By), CreatedAt: e.At}
		if e.From != "" {
			from := string(e.From)
			b.FromStatus = &from
		}
		b.Links.Self = "/api/v1/payments/" + e.SessionID
		out.Data[i] = b
	}
	return out
}
