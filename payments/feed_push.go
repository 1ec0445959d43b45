package payments

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments/gateway/webhooksig"
)

// The events webhook: the events feed (feed.go) POSTed to one URL of the shop
// (EVENTS_WEBHOOK_URL), so that it hears of a completed, failed or canceled payment without
// asking. Each POST is one page of the feed, the body GET /api/v1/events answers
// (FeedBody), signed like the gateway's webhooks (EventsWebhookSignatureHeader: t=…,v1=…, one
// v1 per secret while they rotate).
//
// Delivery is at least once, in the feed's order, from where it began: the first round starts
// at the feed's end (a new endpoint is not sent the history; GET /api/v1/events has it). Every
// replica tries a round each SWEEP_INTERVAL, on a loop of its own beside the patrol (a slow shop
// never holds the patrol's rounds); the one row of events_webhook (migration
// 00211) says how far delivery got. A round takes the row with a lease, POSTs the page after its
// cursor, and moves the cursor only while its lease token is still the row's: a replica whose
// lease ran out mid-POST (a slow shop) writes nothing, and the replica that took over sends the
// same page again, so a page is never skipped and may arrive twice. A shop dedups by event id.
// A POST that fails (no answer, not 2xx) leaves the cursor and waits: 1 s, doubling, at most
// EventsWebhookMaxBackoff, before any replica tries again, with half as many events
// (EventsWebhookPageSize).

// EventsWebhook configures the events webhook. URL "" turns it off.
type EventsWebhook struct {
	URL string
	// Secrets sign each POST, one v1 entry each (EVENTS_WEBHOOK_SECRET; several while rotating).
	Secrets [][]byte
	// Client sends the POSTs (nil: one with EventsWebhookTimeout).
	Client *http.Client
}

const (
	// EventsWebhookSignatureHeader carries the POST's signature (webhooksig's scheme).
	EventsWebhookSignatureHeader = "Pitlane-Signature"
	// EventsWebhookBatch is how many events one POST carries at most; after failed POSTs, half
	// as many each time, down to one (EventsWebhookPageSize).
	EventsWebhookBatch = 100
	// EventsWebhookTimeout bounds one POST; the lease a round holds is twice as long.
	EventsWebhookTimeout = 10 * time.Second
	// EventsWebhookMaxBackoff is the longest wait after failed POSTs.
	EventsWebhookMaxBackoff = 5 * time.Minute
	// eventsWebhookPagesPerRound bounds one round, so a long backlog yields between rounds.
	eventsWebhookPagesPerRound = 10
	// eventsWebhookLease is how long a round holds the row for one page.
	eventsWebhookLease = 2 * EventsWebhookTimeout
	// EventsWebhookHandover is how long no replica of the URL the row delivers to must have
	// taken it before a replica configured with another URL takes it over (a rolling change of
	// EVENTS_WEBHOOK_URL): they take it every round while they run and are not backing off.
	EventsWebhookHandover = time.Minute
)

// PushEvents runs one round of the events webhook: while there are events after the cursor (at
// most eventsWebhookPagesPerRound pages), it takes the row, POSTs a page and moves the cursor.
// It returns how many events the shop acknowledged. Nothing to do when the webhook is off, the
// row is leased by another replica, or a failed POST's wait has not passed.
func (s *Service) PushEvents(ctx context.Context) (int, error) {
	if s.cfg.EventsWebhook.URL == "" {
		return 0, nil
	}
	// The row, once: delivery begins at the feed's end as of now (what is still being written
	// sorts after it, so it is delivered). Bounded as a page is (pushEventsPage).
	sctx, cancel := context.WithTimeout(ctx, eventsWebhookLease)
	_, err := s.db.Exec(sctx, `INSERT INTO events_webhook (cursor, started_at)
		SELECT (`+feedEndSQL+`), $1
		ON CONFLICT (id) DO NOTHING`, s.cfg.Clock.Now())
	cancel()
	if err != nil {
		return 0, dbError("events webhook: start", err, "")
	}
	sent := 0
	for range eventsWebhookPagesPerRound {
		n, more, err := s.pushEventsPage(ctx)
		sent += n
		if err != nil || !more {
			return sent, err
		}
	}
	return sent, nil
}

// runEventsWebhook runs a round of the events webhook every interval until ctx ends (RunSweeper
// starts it beside the patrol when EVENTS_WEBHOOK_URL is set).
func (s *Service) runEventsWebhook(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.PushEvents(ctx); err != nil && ctx.Err() == nil {
			s.logPatrolError("events webhook", err) // an outage's once a minute
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// giveBackEventsWebhook ends a round's lease and changes nothing else ($1 the lease token).
const giveBackEventsWebhook = `UPDATE events_webhook SET lease_owner = NULL, lease_until = NULL, lease_token = NULL
	WHERE id = 1 AND lease_token = $1`

// pushEventsPage POSTs one page; more: another page may be ready.
//
// The row delivers to one URL at a time (url_hash, migration 00760): while replicas of another
// URL still take it (a rolling change of EVENTS_WEBHOOK_URL), this one does not, and takes it
// over, from the cursor, once they have not for EventsWebhookHandover. Before, every replica
// POSTed to its own URL and moved the one cursor: the old and the new endpoint each got
// alternate pages, and neither the whole feed (an outside review).
//
// A URL whose replicas back off (their last take a minute ago or more) is taken over without
// waiting out their back-off: the new URL waited up to EventsWebhookMaxBackoff, then raced the
// old URL's replicas (a review of the events webhook). The failures in a row are kept across the
// handover: reset at each change of URL, two URLs both failing (a rolling change stuck half way,
// one replica's typo) took the row from each other every two minutes with a fresh count, the
// back-off never grew and the alert never fired (a review of that fix).
//
// A page's work lasts its lease at most: past it another replica may take the row over, and under
// the loop's context alone a statement the database never answered (a failover that left the old
// host silent) held this replica's deliveries until TCP gave up.
func (s *Service) pushEventsPage(ctx context.Context) (sent int, more bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, eventsWebhookLease)
	defer cancel()
	now := s.cfg.Clock.Now()
	leaseUntil := now.Add(eventsWebhookLease)
	url := eventsWebhookURLHash(s.cfg.EventsWebhook.URL)
	var cursor, token, before string
	var attempts int
	err = s.db.QueryRow(ctx, `WITH before AS (SELECT url_hash FROM events_webhook WHERE id = 1)
		UPDATE events_webhook SET lease_owner = $1, lease_until = $2, lease_token = gen_random_uuid(), url_hash = $4, url_seen_at = $3
		WHERE id = 1 AND (lease_until IS NULL OR lease_until <= $3)
		  AND (url_hash IS NULL OR url_hash = $4 OR url_seen_at IS NULL OR url_seen_at <= $5)
		  AND (next_attempt_at IS NULL OR next_attempt_at <= $3 OR url_hash <> $4)
		RETURNING cursor, lease_token::text, attempts, coalesce((SELECT url_hash FROM before), '')`,
		s.cfg.ReplicaID, leaseUntil, now, url, now.Add(-EventsWebhookHandover)).Scan(&cursor, &token, &attempts, &before)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another replica delivers, or the wait after a failure runs, or another URL's replicas
		// still deliver: said once, when it begins.
		var fenced bool
		if err := s.db.QueryRow(ctx, `SELECT coalesce(url_hash <> $1 AND url_seen_at > $2, false) FROM events_webhook WHERE id = 1`,
			url, now.Add(-EventsWebhookHandover)).Scan(&fenced); err != nil {
			return 0, false, dbError("events webhook: read", err, "")
		}
		if fenced && !s.eventsWebhookFenced.Swap(true) {
			s.log.Warn("events webhook: other replicas deliver to another EVENTS_WEBHOOK_URL; this one takes over once they have not for a minute",
				"replica", s.cfg.ReplicaID)
		}
		return 0, false, nil
	}
	if err != nil {
		return 0, false, dbError("events webhook: take", err, "")
	}
	if s.eventsWebhookFenced.Swap(false) || (before != "" && before != url) {
		s.log.Warn("events webhook: delivering to this replica's EVENTS_WEBHOOK_URL from here on (the other URL's replicas stopped)",
			"replica", s.cfg.ReplicaID, "cursor", cursor)
	}
	// release writes the round's outcome and gives the row back, only while the lease is still
	// this round's; kept is false when another replica had taken the row over meanwhile.
	release := func(ctx context.Context, sql string, args ...any) (kept bool, err error) {
		tag, err := s.execDetached(ctx, sql, append([]any{token}, args...)...)
		if err != nil {
			return false, dbError("events webhook: write", err, "")
		}
		if tag.RowsAffected() == 0 {
			s.log.Warn("events webhook: the lease ran out during the POST; the replica that took over sends the page again", "replica", s.cfg.ReplicaID)
			return false, nil
		}
		return true, nil
	}
	// fail counts a failed attempt: the row waits (1 s, doubling, at most EventsWebhookMaxBackoff)
	// and says why (the Operations page, pitlane_events_webhook_failures and its alert).
	fail := func(cause string) error {
		wait := min(time.Second<<min(attempts, 20), EventsWebhookMaxBackoff)
		s.log.Warn("events webhook: delivery failed", "err", cause, "attempt", attempts+1, "retry_in", wait)
		_, err := release(ctx, `UPDATE events_webhook SET attempts = attempts + 1, next_attempt_at = $2, last_error = $3,
			lease_owner = NULL, lease_until = NULL, lease_token = NULL WHERE id = 1 AND lease_token = $1`,
			s.cfg.Clock.Now().Add(wait), truncate(cause, 500))
		return err
	}
	if _, _, err := parseFeedCursor(cursor); err != nil {
		// Not an event id (set by hand before migration 00910 refused such values; 'end' would
		// read the feed's end every round): no page will ever come.
		return 0, false, fail(fmt.Sprintf("the cursor %q is not an event id the feed returned: set it to one, or delete the row to start at the feed's end", cursor))
	}
	page, err := s.Feed(ctx, cursor, EventsWebhookPageSize(attempts))
	if ErrorCode(err) == EEXPIRED {
		// The cursor names an event of a history this database does not have (a restore to an
		// earlier point): no page will ever come, so it is a failure like a refused POST, not an
		// error logged every round with nothing counted and no alert (an outside review).
		// docs/operations.md: set the cursor, or delete the row.
		return 0, false, fail("the cursor " + cursor + " is lost: " + ErrorMessage(err))
	}
	if err != nil {
		if _, rerr := release(ctx, giveBackEventsWebhook); err == nil {
			err = rerr
		}
		return 0, false, err
	}
	if len(page.Events) == 0 {
		// Nothing after the cursor: nothing fails. A failure counted before is over (an
		// operator moved a lost cursor or skipped a page the shop refuses, as the runbook
		// says: the card and the alert kept "failing" until a later event was delivered, on a
		// quiet shop all night; a review of the events webhook).
		_, err := release(ctx, `UPDATE events_webhook SET attempts = 0, next_attempt_at = NULL, last_error = '',
			lease_owner = NULL, lease_until = NULL, lease_token = NULL WHERE id = 1 AND lease_token = $1`)
		return 0, false, err
	}
	if h := s.cfg.Hooks.AfterEventsPageRead; h != nil {
		h(ctx)
	}
	if s.cfg.Clock.Now().Add(EventsWebhookTimeout).After(leaseUntil) {
		// Less of the lease is left than a POST may take (the feed read was slow): a POST sent
		// now could outlive the lease while another replica takes the row over and sends this
		// page, or the next one, beside it — out of order at the shop. Give the row back; the
		// next round reads again with a fresh lease.
		s.log.Warn("events webhook: the page took too long to read; sending it next round", "replica", s.cfg.ReplicaID)
		_, err := release(ctx, giveBackEventsWebhook)
		return 0, false, err
	}
	posted := s.cfg.Clock.Now()
	if perr := s.postEvents(ctx, page.Body()); perr != nil && ctx.Err() != nil {
		// Shutdown cut the POST: give the row back as it was (another replica sends the page;
		// the shop did nothing wrong, so no attempt is counted) — once the cut POST can no
		// longer land: the shop may still be reading it, and given back at once, the next
		// replica's newer page reached the shop before it (an outside review, stop).
		_, err := release(ctx, `UPDATE events_webhook SET lease_owner = NULL, lease_until = $2, lease_token = NULL
			WHERE id = 1 AND lease_token = $1`, posted.Add(EventsWebhookTimeout))
		return 0, false, err
	} else if perr != nil {
		return 0, false, fail(perr.Error())
	}
	// The cursor moves only from where the page was read: an operator who set it during the POST
	// (to send again from an earlier point, docs/operations.md) had it overwritten by this page's
	// end, and the shop never got the events again (an outside review). The next round reads
	// from the operator's.
	kept, err := release(ctx, `UPDATE events_webhook SET cursor = CASE WHEN cursor = $5 THEN $2 ELSE cursor END,
		attempts = 0, next_attempt_at = NULL, last_error = '',
		delivered_at = $3, delivered_events = delivered_events + $4, lease_owner = NULL, lease_until = NULL, lease_token = NULL
		WHERE id = 1 AND lease_token = $1`, page.Next, s.cfg.Clock.Now(), len(page.Events), cursor)
	return len(page.Events), page.More && kept, err
}

// EventsWebhookPageSize is how many events the next POST carries at most after attempts failed
// POSTs in a row: EventsWebhookBatch, halved at each failure, down to one. A page the shop could
// not take whole (too large for its body limit, too slow for EventsWebhookTimeout, one event it
// refuses) was POSTed again whole for ever: the events before the one it refuses never reached it,
// and nothing said which one it was (a review of the events webhook). Halving sends what the shop
// takes and leaves the one it refuses alone in the page: the card shows it, and the operator
// skips it by the cursor (docs/operations.md). A success goes back to whole pages.
func EventsWebhookPageSize(attempts int) int {
	return max(1, EventsWebhookBatch>>min(attempts, 16))
}

// eventsWebhookURLHash is what events_webhook.url_hash holds of a URL (SHA-256, hex).
func eventsWebhookURLHash(url string) string {
	sum := sha256.Sum256([]byte(url))
	return hex.EncodeToString(sum[:])
}

// postEvents POSTs body, signed; any answer but 2xx is a failure.
func (s *Service) postEvents(ctx context.Context, body FeedBody) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, EventsWebhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.EventsWebhook.URL, bytes.NewReader(raw))
	if err != nil {
		return withoutURL(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(EventsWebhookSignatureHeader, webhooksig.SignAll(s.cfg.EventsWebhook.Secrets, s.cfg.Clock.Now(), raw))
	c := s.cfg.EventsWebhook.Client
	if c == nil {
		// A redirect is an answer that is not 2xx, not a place to send the events to.
		c = &http.Client{Timeout: EventsWebhookTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	resp, err := c.Do(req)
	if err != nil {
		return withoutURL(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // the answer's body says nothing
	if resp.StatusCode/100 != 2 {
		// Not the URL: it may carry credentials (https://user:password@…), and this goes to the
		// log and to events_webhook.last_error.
		return fmt.Errorf("the shop's endpoint answered %d", resp.StatusCode)
	}
	return nil
}

// EventsWebhookState is where the events webhook stands, for the Operations page.
type EventsWebhookState struct {
	// On: this replica pushes (EVENTS_WEBHOOK_URL is set here). The rest is the whole
	// database's, whichever replica delivers.
	On bool
	// Started: delivery has begun (the first round wrote the row); nothing below is set before.
	Started         bool
	StartedAt       time.Time
	DeliveredAt     *time.Time
	DeliveredEvents int64
	// Waiting counts the events after the cursor, at most EventsWebhookWaitingShown+1 (more
	// than that: "over EventsWebhookWaitingShown"); OldestWaiting is the oldest one's time.
	Waiting       int
	OldestWaiting *time.Time
	// Failures are the failed POSTs in a row; NextAttemptAt and LastError say when the next
	// try comes and why the last one failed.
	Failures      int
	NextAttemptAt *time.Time
	LastError     string
	LeaseOwner    string // the replica POSTing right now, when its lease is still live
	// FirstWaiting is the event after the cursor, with its order (what a failing POST begins
	// with: a page of one, after enough failures, is the one the shop refuses).
	FirstWaiting      string
	FirstWaitingOrder string
}

// EventsWebhookWaitingShown bounds the count of waiting events EventsWebhookStatus reads.
const EventsWebhookWaitingShown = 1000

// EventsWebhookStatus reads where the events webhook stands.
func (s *Service) EventsWebhookStatus(ctx context.Context) (EventsWebhookState, error) {
	st := EventsWebhookState{On: s.cfg.EventsWebhook.URL != ""}
	now := s.cfg.Clock.Now()
	var cursor string
	err := s.db.QueryRow(ctx, `SELECT cursor, started_at, delivered_at, delivered_events, attempts, next_attempt_at, last_error,
			CASE WHEN lease_until > $1 THEN coalesce(lease_owner, '') ELSE '' END
		FROM events_webhook WHERE id = 1`, now).
		Scan(&cursor, &st.StartedAt, &st.DeliveredAt, &st.DeliveredEvents, &st.Failures, &st.NextAttemptAt, &st.LastError, &st.LeaseOwner)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, dbError("events webhook: status", err, "")
	}
	st.Started = true
	if st.Waiting, st.OldestWaiting, err = eventsAfter(ctx, s.db, cursor, EventsWebhookWaitingShown+1); err != nil {
		return st, err
	}
	if st.Failures > 0 && st.Waiting > 0 {
		// What the failing POST begins with: the feed's next event, as the round reads it.
		if page, err := s.Feed(ctx, cursor, 1); err == nil && len(page.Events) == 1 {
			ev := page.Body().Data[0]
			st.FirstWaiting, st.FirstWaitingOrder = ev.ID, ev.OrderID
		}
	}
	return st, nil
}

// eventsAfter counts the events committed after cursor, at most limit, and gives the oldest
// one's time (nil when none): through each table's (xid, id) index, at most limit rows each.
// Those the feed does not serve yet count too: a transaction left open in the cluster holds them
// back from the shop (feedServes), and they wait all the same — counting only what the feed
// served, the lag stayed 0 and PitlaneEventsWebhookBehind silent while the shop heard nothing
// (an outside review).
//
// A cursor that is not an event id counts nothing: the round that reads it counts a failure
// (pushEventsPage) and says why; failing here failed every replica's stats with it.
func eventsAfter(ctx context.Context, q querier, cursor string, limit int) (n int, oldest *time.Time, err error) {
	xid, id, err := parseFeedCursor(cursor)
	if err != nil {
		return 0, nil, nil
	}
	if err := q.QueryRow(ctx, eventsAfterSQL, xid, id, limit).Scan(&n, &oldest); err != nil {
		return 0, nil, dbError("events webhook: waiting", err, "")
	}
	return min(n, limit), oldest, nil // (each table gave at most limit)
}

// eventsAfterSQL is eventsAfter's count: feedSQL's arguments.
var eventsAfterSQL = `SELECT count(*), min(ev.created_at) FROM ` + feedEvents(feedAfter, ``, `e.xid, e.id`, `$3`)

// RetryEventsWebhookNow ends the wait after failed POSTs of the events webhook, so that the next
// round of any replica that pushes sends at once (an operator who fixed the shop's endpoint need
// not wait up to EventsWebhookMaxBackoff). The failures in a row stay counted until a POST
// succeeds. ECONFLICT when delivery does not wait for a retry. Audited in the same transaction.
func (s *Service) RetryEventsWebhookNow(ctx context.Context, by Staff) error {
	now := s.cfg.Clock.Now()
	return s.inTx(ctx, "events webhook: retry now", func(tx pgx.Tx) error {
		var attempts int
		err := tx.QueryRow(ctx, `UPDATE events_webhook SET next_attempt_at = NULL
			WHERE id = 1 AND next_attempt_at > $1 RETURNING attempts`, now).Scan(&attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return Errorf(ECONFLICT, "the events webhook is not waiting to retry: it delivers, or its next try is due already")
		}
		if err != nil {
			return dbError("events webhook: retry now", err, "")
		}
		// The admin still stands (their session, their role): a click of one disabled while it
		// was on its way ends nothing, as no other console change of theirs does.
		if err := staffStands(ctx, tx); err != nil {
			return err
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditEventsWebhookRetry,
			Target: "events_webhook", Detail: fmt.Sprintf("wait ended after %d failed POSTs in a row", attempts)}, now)
	})
}
