package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments/gateway/webhooksig"
)

// Message is a message to a customer (a one-time code, …). Its JSON is the contract's
// NOTIFY_WEBHOOK_URL body: {"to","kind","text","order_id","payment_id"}, and "id".
type Message struct {
	// ID is the message's own (its outbox row's message_id, a random UUID), the same on every try
	// of it: delivery is at least once (a retry after an answer that was lost), and the receiver
	// drops a message whose id it has sent on already, rather than text the customer the same
	// code twice (an outside review). Not the row's serial, which a point-in-time restore hands
	// out again and every install counts from 1 (another review: a new code was dropped as a
	// repeat); a row written before migration 00850 keeps its serial, as its earlier tries had it.
	ID        string `json:"id"`
	To        string `json:"to"`
	Kind      string `json:"kind"`
	Text      string `json:"text"`
	OrderID   string `json:"order_id"`
	PaymentID string `json:"payment_id"`
	// Redacted is Text without its secret (a one-time code), what the outbox keeps once the
	// message is delivered; "" when Text holds nothing secret. Never sent.
	Redacted string `json:"-"`
	// ChallengeID is the one-time code's challenge a code message carries (a cancel's or a
	// refund's; "" for other messages): the retry sends nothing for a challenge that is dead by
	// then. Never sent.
	ChallengeID string `json:"-"`
}

// Notifier delivers a message outside pitlane. Every message is also kept in the outbox table,
// written in the same transaction as what caused it, so nothing is lost when delivery fails.
type Notifier interface {
	Notify(ctx context.Context, m Message) error
}

// WebhookNotifier POSTs messages as JSON to a URL (NOTIFY_WEBHOOK_URL).
type WebhookNotifier struct {
	URL    string
	Client *http.Client
	// Secrets, when set (NOTIFY_WEBHOOK_SECRET; several while rotating), sign each POST as the
	// events webhook's are (EventsWebhookSignatureHeader, webhooksig's t=…,v1=…): the service that
	// sends codes on to customers can refuse a message pitlane did not send (a forged POST would
	// have it text customers codes nobody asked for).
	Secrets [][]byte
	// Now is the signature's time (time.Now when nil).
	Now func() time.Time
}

func (n WebhookNotifier) Notify(ctx context.Context, m Message) error {
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL, bytes.NewReader(body))
	if err != nil {
		return withoutURL(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if len(n.Secrets) > 0 {
		now := time.Now
		if n.Now != nil {
			now = n.Now
		}
		req.Header.Set(EventsWebhookSignatureHeader, webhooksig.SignAll(n.Secrets, now(), body))
	}
	c := http.Client{Timeout: NotifierTimeout}
	if n.Client != nil {
		c = *n.Client
	}
	// A redirect is not a delivery: Go's client would send the POST again as a GET without its
	// body (301, 302, 303) and count that GET's 200, and the outbox would mark the code delivered
	// and keep only its redacted text (an outside review). A 3xx is an error like any other
	// non-2xx answer: retried, and seen in the admins' outbox.
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		return withoutURL(err)
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 3:
		return fmt.Errorf("notify: the endpoint answered %d, a redirect: NOTIFY_WEBHOOK_URL must name the address that takes the POST", resp.StatusCode)
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("notify: the endpoint answered %d", resp.StatusCode)
	}
	return nil
}

// outboxMessageID is an outbox row's message id in a query (Message.ID).
const outboxMessageID = `coalesce(message_id::text, id::text)`

// queuedMessage is a message enqueue wrote, with the lease its writer holds on it until it has
// delivered it (deliverQueued).
type queuedMessage struct {
	id    int64
	token string
	until time.Time // the writer's lease on the row (zero: none)
	msg   Message
}

// enqueue writes a message to the outbox in the caller's transaction. With a notifier, the
// writer leases the row (leaseUntil) for its own delivery after commit: the patrol takes the
// message over only once that lease has run out, never while the writer's notifier call is
// still on the wire (an outside review: a slow notifier past the never-tried grace got the code
// sent twice, and the writer's record then cleared the patrol's lease).
func enqueue(ctx context.Context, tx pgx.Tx, m Message, now, leaseUntil time.Time) (queuedMessage, error) {
	q := queuedMessage{msg: m, until: leaseUntil}
	var until any
	if !leaseUntil.IsZero() {
		until = leaseUntil
	}
	var pid, cid any
	if m.PaymentID != "" {
		pid = m.PaymentID
	}
	if m.ChallengeID != "" {
		cid = m.ChallengeID
	}
	err := tx.QueryRow(ctx, `INSERT INTO outbox (kind, to_addr, body, redacted_body, order_id, payment_id, challenge_id, created_at,
			lease_until, lease_token)
		VALUES ($1, $2, $3, nullif($4, ''), nullif($5, ''), $6, $7, $8, $9, CASE WHEN $9::timestamptz IS NOT NULL THEN gen_random_uuid() END)
		RETURNING id, `+outboxMessageID+`, coalesce(lease_token::text, '')`, m.Kind, m.To, m.Text, m.Redacted, m.OrderID, pid, cid, now, until).
		Scan(&q.id, &q.msg.ID, &q.token)
	if err != nil {
		return queuedMessage{}, fmt.Errorf("outbox: %w", err)
	}
	return q, nil
}

// deliverQueued delivers a message its writer enqueued, under the writer's lease on the row. The
// notifier's call ends writerRecordTime before the lease does (the lease was counted from before
// the writer's lock wait, and the notifier's own timeout is fixed): a call still on the wire when
// the patrol may take the message over would send the customer the same code twice. What the
// writer cannot send in its lease is the patrol's. It returns why the message did not reach the
// notifier ("" when it did, when nothing was queued, or without a notifier): staff must not be
// told a code went to the customer when it did not (an outside review, outbox).
func (s *Service) deliverQueued(ctx context.Context, q queuedMessage) (undelivered string) {
	if q.id == 0 {
		return "" // nothing was queued (a form sent again answered its open code)
	}
	ctx = withStop(ctx)
	if q.token != "" {
		left := q.until.Sub(s.cfg.Clock.Now()) - writerRecordTime
		if left <= 0 {
			s.log.Warn("outbox: no time left in the writer's lease to deliver the message; the patrol sends it",
				"outbox_id", q.id, "kind", q.msg.Kind)
			return "not tried yet: the request ran out of time"
		}
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(withLease(ctx, outboxLeaseID(q.id), q.token), left)
		defer stop()
	}
	if _, err := s.deliver(ctx, q.id, q.msg); err != nil {
		return err.Error()
	}
	return ""
}

// codeExpiry is how a code's message says when the code expires, left from now (whole minutes,
// rounded down: never more than is left). codeExpiryRe finds it in a stored message, whose
// retry says it anew.
func codeExpiry(left time.Duration) string {
	switch m := int(left / time.Minute); {
	case m < 1:
		return "It expires in less than a minute."
	case m == 1:
		return "It expires in 1 minute."
	default:
		return fmt.Sprintf("It expires in %d minutes.", m)
	}
}

var codeExpiryRe = regexp.MustCompile(`It expires in (?:\d+ minutes?|less than a minute)\.`)

// NotifierTimeout bounds one POST of WebhookNotifier (a lease's end may cut it sooner).
const NotifierTimeout = 10 * time.Second

// writerRecordTime is what a writer's delivery keeps of its lease to record the outcome.
const writerRecordTime = 2 * time.Second

// outboxAttempts bounds how often one message is tried.
const outboxAttempts = 5

// DeliverOutbox is one round of the patrol over undelivered messages (NOTIFY_WEBHOOK_URL was
// down), with the same pool and lease rules as sessions (patrol.go): each message is leased in a
// short transaction (SKIP LOCKED and a fresh token, so two replicas never send the same message
// at once), sent after commit with no lock held, and its outcome recorded only while the token
// holds. A message the request that wrote it is delivering is leased by that request
// (enqueue); one never tried is also left alone for RegisterGrace.
//
// A one-time code that is dead by then is not sent: its challenge was superseded by a newer code
// (the customer would get an old code that answers 410 next to the new one), consumed (the first
// delivery reached the customer after all, and they have read it out), it expired (no use to
// anyone), or it is spent: wrong guesses used up its attempts, and ConfirmCancel refuses it for
// good (a challenge's attempts never go down; UnlockCodes lifts the payment's lock, not that), or
// it is a cancel code of a payment that has finished meanwhile (Completed, Failed, Canceled: the
// code could only be refused, and the customer would be asked to cancel a payment that is over;
// an outside review), or a refund code whose refund no longer fits what the payment has left
// (refunds that have not failed and a refund proposal waiting for approval, as ConfirmRefund
// counts: the shop's API refunded it meanwhile; an outside review, notifier abuse; its challenge
// is superseded with it, so the form sent again once the room is back sends a new code). Such a message is marked skipped with the reason, in the same claim, and its code
// redacted like a delivered one. A code that dies while its message is on the wire (after the
// claim committed) still arrives: closing that window would mean holding a lock across the
// notifier's HTTP call, and the code answers 410 anyway.
func (s *Service) DeliverOutbox(ctx context.Context) (int, error) {
	if s.cfg.Notifier == nil {
		return 0, nil
	}
	rep, err := s.runRound(ctx, []patrolSource{s.outboxSource()}, nil, 0)
	return rep.Driven, err
}

func (s *Service) outboxSource() patrolSource {
	return patrolSource{kind: "outbox", claim: func(ctx context.Context, limit int) ([]patrolJob, error) {
		now := s.cfg.Clock.Now()
		var jobs []patrolJob
		err := s.inTx(ctx, "outbox: claim", func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `
				WITH due AS (
					SELECT o.id AS due_id, o.challenge_id AS due_challenge, c.expires_at AS code_expires_at,
						`+deadCodeSQL("$2", "$3")+` AS dead
					FROM outbox o LEFT JOIN cancel_challenges c ON c.id = o.challenge_id
						LEFT JOIN payment_sessions ps ON ps.id = c.session_id
					WHERE o.delivered_at IS NULL AND o.skipped_at IS NULL AND o.attempts < $1
					  AND coalesce(o.next_attempt_at, o.created_at + $4::interval) <= $2
					  AND (o.lease_until IS NULL OR o.lease_until <= $2)
					ORDER BY o.id LIMIT $5
					FOR UPDATE OF o SKIP LOCKED
				), skipped AS (
					-- Rows without a challenge_id (other kinds, and codes written before it existed)
					-- fall back on the code's TTL from the message's own age.
					UPDATE outbox SET skipped_at = $2, skip_reason = due.dead, body = coalesce(redacted_body, body)
					FROM due WHERE id = due.due_id AND due.dead IS NOT NULL
				), unsent AS (
					-- A refund code skipped for want of room is never sent now, but its challenge
					-- was still open: when the room came back (a proposal rejected, a refund
					-- failed) the same form answered it as sent and sent nothing (a review of this
					-- rule). It is superseded: the form sent again issues a new code.
					UPDATE cancel_challenges SET superseded_at = $2
					FROM due WHERE id = due.due_challenge AND due.dead IN ('no_room', 'redacted') AND superseded_at IS NULL AND consumed_at IS NULL
				)
				UPDATE outbox SET lease_until = $6, lease_token = gen_random_uuid()
				FROM due WHERE id = due.due_id AND due.dead IS NULL
				RETURNING id, `+outboxMessageID+`, kind, to_addr, body, coalesce(order_id, ''), coalesce(payment_id::text, ''), lease_token::text,
					due.code_expires_at`,
				outboxAttempts, now, now.Add(-s.cfg.CodeTTL), s.cfg.RegisterGrace, limit, now.Add(s.cfg.LeaseDuration))
			if err != nil {
				return fmt.Errorf("outbox: claim: %w", err)
			}
			defer rows.Close()
			for rows.Next() {
				var id int64
				var m Message
				var token string
				var expires *time.Time
				if err := rows.Scan(&id, &m.ID, &m.Kind, &m.To, &m.Text, &m.OrderID, &m.PaymentID, &token, &expires); err != nil {
					return err
				}
				// The delivery's record is its release (deliver's guarded UPDATEs).
				jobs = append(jobs, patrolJob{id: outboxLeaseID(id), token: token, leasedAt: now, run: func(ctx context.Context) driveEnd {
					if expires != nil {
						// A retry minutes after the code was issued says what is left of it: the
						// text written then said the whole CodeTTL (an outside review, outbox).
						m.Text = codeExpiryRe.ReplaceAllLiteralString(m.Text, codeExpiry(expires.Sub(s.cfg.Clock.Now())))
					}
					_, _ = s.deliver(withLease(ctx, outboxLeaseID(id), token), id, m)
					return endDone
				}})
			}
			return rows.Err()
		})
		return jobs, err
	}}
}

// deadCodeSQL is why the code of outbox row o (its challenge c, its payment ps) can no longer be
// used, NULL while it can (or the row holds no code): consumed, superseded by a newer code,
// expired (now and cutoff are the placeholders of the time and of now less CodeTTL, for rows
// from before messages named their challenge), out of attempts, a cancel code of a finished
// payment, a refund code for more than the payment has left ('no_room': its refunds and a
// waiting refund proposal). One list for the outbox claim and the housekeeping: the two drifted
// apart, and a refund code with no room stayed in clear and counted as failing after
// housekeeping (an outside review, chaos3).
//
// 'no_room' only for a code nobody read in the admin's outbox (cancel_challenges.seen_by): room
// can come back (a proposal rejected, a refund failed), and a code an admin relayed from the
// outbox (no NOTIFY_WEBHOOK_URL, or its delivery failing) was superseded while a proposal held the
// room and refused once it was back (reviews of this rule).
//
// 'redacted' when none of those holds but the row's text no longer holds its code — redacted
// for want of room while its delivery was on the wire, by a release before RedactDeadCodes left
// such a row alone, and usable again (its room back, an admin having read it): its retry sent
// "your code is ••••••" and marked it delivered, its challenge still open (a review of outbound
// deliveries). Its challenge is superseded as for 'no_room': the form sent again issues a new
// code.
func deadCodeSQL(now, cutoff string) string {
	return `CASE WHEN o.redacted_body IS NULL THEN NULL -- holds no code: never dead
		WHEN c.consumed_at IS NOT NULL THEN 'consumed'
		WHEN c.superseded_at IS NOT NULL THEN 'superseded'
		WHEN c.expires_at <= ` + now + ` OR (c.id IS NULL AND o.created_at <= ` + cutoff + `) THEN 'expired'
		WHEN c.attempts >= c.max_attempts THEN 'spent'
		WHEN c.action = '` + string(CodeCancel) + `' AND ps.status IN (` + terminalStatusSQL + `) THEN 'finished'
		WHEN cardinality(c.seen_by) = 0 AND c.action = '` + string(CodeRefund) + `' AND c.amount > ps.amount
			- (SELECT coalesce(sum(r.amount), 0) FROM refunds r WHERE r.session_id = ps.id AND r.status <> 'Failed')
			- coalesce((SELECT p.refund_amount FROM resolution_proposals p
			            WHERE p.session_id = ps.id AND p.kind = 'refund' AND p.state = 'proposed'), 0) THEN 'no_room'
		WHEN o.body = o.redacted_body THEN 'redacted'
		END`
}

// RedactDeadCodes replaces the text of messages whose one-time code can no longer be used
// (deadCodeSQL) by its redacted text, in batches of at most batch rows (FOR UPDATE SKIP LOCKED:
// never waiting for a delivery's claim). A delivered message keeps only its redacted text
// already; without a NOTIFY_WEBHOOK_URL nothing is ever delivered (the outbox is the channel
// admins relay from), and every code ever sent stayed in clear in the table and in each copy of
// the database. The patrol's housekeeping calls it. A message not yet sent and not on its way
// (no live lease) is marked skipped with the reason, as the outbox claim marks one (and a refund
// code's challenge skipped for want of room superseded, as there): a code whose tries failed
// waited, counted as failing (the customer-messages alert), until its next try minutes after it
// had died (an outside review, notifier2).
func (s *Service) RedactDeadCodes(ctx context.Context, now time.Time, batch int) (int, error) {
	total := 0
	// Two passes, each read by its partial index (one OR over both read the whole outbox): the
	// codes still in clear (outbox_clear_codes), then the failing messages already redacted —
	// redacted while on their way, whose try then failed (outbox_failing): they counted as
	// failing until their next try (a review of this rule).
	for _, candidates := range []string{
		// delivered_at IS NULL holds for every code in clear (a delivery redacts it) and is what
		// the planner can count (its estimate of body <> redacted_body is "nearly every row").
		`o.redacted_body IS NOT NULL AND o.body <> o.redacted_body AND o.delivered_at IS NULL`,
		`o.delivered_at IS NULL AND o.skipped_at IS NULL AND o.attempts > 0 AND o.redacted_body IS NOT NULL AND o.body = o.redacted_body
			AND (o.lease_until IS NULL OR o.lease_until <= $1)`,
	} {
		n, err := s.execBatches(ctx, "redact dead codes", batch, `WITH dead AS (
			SELECT o.id, o.challenge_id, `+deadCodeSQL("$1", "$2")+` AS reason,
				o.delivered_at IS NULL AND o.skipped_at IS NULL AND (o.lease_until IS NULL OR o.lease_until <= $1) AS unsent
			FROM outbox o LEFT JOIN cancel_challenges c ON c.id = o.challenge_id
				LEFT JOIN payment_sessions ps ON ps.id = c.session_id
			WHERE `+candidates+`
			  AND `+deadCodeSQL("$1", "$2")+` IS NOT NULL
			  -- Not a code on its way for want of room, the one reason that can pass (the room
			  -- back, an admin reading it): redacted under a delivery that reached the customer
			  -- with its answer lost, or that then failed, it was withdrawn though the customer
			  -- held it, or sent as "••••••" (reviews of outbound deliveries). Its delivery ends
			  -- first; the claim then skips it if it is still dead.
			  AND (o.lease_until IS NULL OR o.lease_until <= $1 OR `+deadCodeSQL("$1", "$2")+` <> 'no_room')
			ORDER BY o.id LIMIT $3 FOR UPDATE OF o SKIP LOCKED
		), unsent AS (
			UPDATE cancel_challenges SET superseded_at = $1
			FROM dead WHERE cancel_challenges.id = dead.challenge_id AND dead.unsent AND dead.reason IN ('no_room', 'redacted') AND superseded_at IS NULL AND consumed_at IS NULL
		)
		UPDATE outbox o SET body = o.redacted_body,
			skipped_at = CASE WHEN dead.unsent THEN $1 ELSE o.skipped_at END,
			skip_reason = CASE WHEN dead.unsent THEN dead.reason ELSE o.skip_reason END
		FROM dead WHERE o.id = dead.id`, now, now.Add(-s.cfg.CodeTTL))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// outboxLeaseID names an outbox row's lease in a drive's context.
func outboxLeaseID(id int64) string { return fmt.Sprintf("outbox:%d", id) }

// deliver hands one outbox message to the Notifier (when configured) and records the result.
// Failures stay in the outbox with the error and the next try 1, 2, 4, … minutes later; the
// message text is never logged (it may hold a code). A delivered message keeps only its redacted
// text: the code reached the customer, and the outbox (which admins read) must not hold it in
// clear any longer. A patrol drive records only while the row still carries its lease token (a
// guarded UPDATE); held=false when it no longer did. failed is the notifier's error, if any.
func (s *Service) deliver(ctx context.Context, outboxID int64, m Message) (held bool, failed error) {
	if s.cfg.Notifier == nil {
		return true, nil
	}
	var token any // nil: not a patrol drive (the request that wrote the message delivers it)
	if t, ok := leaseOf(ctx, outboxLeaseID(outboxID)); ok {
		token = t
	}
	err := s.panicAsError("notify", func() error { return s.cfg.Notifier.Notify(ctx, m) })
	now := s.cfg.Clock.Now()
	if err != nil && stopped(ctx) {
		// A stop cut the delivery (the patrol's SIGTERM, or the request that wrote it ended): the
		// row goes back as it was, due now for the next round, no attempt counted — counting the
		// cut try pushed a code past its expiry or, as its fifth try, out of the outbox for good.
		// A delivery that ran out of its own time (the drive's budget, the writer's lease) is a
		// failed try like any other: a notifier slower than that is retried on the schedule and
		// at most outboxAttempts times, not sent again every round.
		s.log.Warn("notify cut by a stop; the next round sends it", "outbox_id", outboxID, "kind", m.Kind, "err", err)
		tag, uerr := s.execDetached(ctx, `UPDATE outbox SET lease_until = NULL, lease_token = NULL
			WHERE id = $1 AND delivered_at IS NULL AND ($2::uuid IS NULL OR lease_token = $2)`, outboxID, token)
		if uerr != nil {
			s.log.Error("outbox: give back", "outbox_id", outboxID, "err", uerr)
		}
		return uerr != nil || tag.RowsAffected() == 1, err
	}
	if err != nil {
		s.log.Warn("notify failed", "outbox_id", outboxID, "kind", m.Kind, "err", err)
		tag, uerr := s.execDetached(ctx, `UPDATE outbox SET attempts = attempts + 1, last_error = $2,
			next_attempt_at = $3::timestamptz + interval '1 minute' * power(2, attempts), lease_until = NULL, lease_token = NULL
			WHERE id = $1 AND ($4::uuid IS NULL OR lease_token = $4)`, outboxID, truncate(err.Error(), 2000), now, token)
		if uerr != nil {
			s.log.Error("outbox: record failure", "outbox_id", outboxID, "err", uerr)
		}
		return uerr != nil || tag.RowsAffected() == 1, err
	}
	tag, uerr := s.execDetached(ctx, `UPDATE outbox SET attempts = attempts + 1, delivered_at = $2, last_error = NULL,
		body = coalesce(redacted_body, body), lease_until = NULL, lease_token = NULL
		WHERE id = $1 AND ($3::uuid IS NULL OR lease_token = $3)`, outboxID, now, token)
	if uerr != nil {
		s.log.Error("outbox: record delivery", "outbox_id", outboxID, "err", uerr)
	}
	return uerr != nil || tag.RowsAffected() == 1, nil
}

// withoutURL is an HTTP client's error without the URL it names. Go's *url.Error carries the
// whole request URL — a user name, a path, a query that may hold a token (only a password is
// masked) — and the errors of the webhooks pitlane POSTs to (NOTIFY_WEBHOOK_URL,
// EVENTS_WEBHOOK_URL) are logged and stored where staff read them (the outbox, the Operations
// page's events webhook card). What failed is kept: "Post: dial tcp 10.0.0.7:443: connection
// refused", a timeout, a TLS error.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}
