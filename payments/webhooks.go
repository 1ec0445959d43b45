package payments

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// GatewayEvent is a gateway webhook event whose signature was verified, reduced to what
// identifies it and the payment it is about. Nothing else in the event is trusted: it is a hint
// to ask the gateway, never a state to apply (gateway-api.md, "Webhooks").
type GatewayEvent struct {
	ID        string // the gateway's event id, unique per gateway
	Type      string // e.g. payment.updated, payment_intent.succeeded
	PaymentID string // the gateway payment it concerns; "" when it concerns none
	Reference string // our reference as the event carries it; "" when it does not (Stripe)
}

// MaxGatewayIDLen bounds, in bytes, the ids a webhook event names: its own and its payment's.
// Both are stored in webhook_events and indexed (the unique (gateway, event_id) that dedups
// deliveries, and (gateway, gateway_payment_id)), and a btree entry must fit in a third of a page
// (about 2,700 bytes): a longer id failed the INSERT with SQLSTATE 54000, the receiver answered
// 500 and the gateway delivered the event again for days (an outside review). 255 is what Stripe
// documents its generated ids never to exceed ("API upgrades": store them in a VARCHAR(255)), far
// above the reference gateway's (evt_…, gp_…) and well under the index's limit whatever the
// bytes; an event naming a longer id is no event of a gateway we speak to.
const MaxGatewayIDLen = 255

// WebhookVerifier checks one delivery of a gateway's signed webhook and reads the event out of
// it. Each gateway adapter implements it for its own signature scheme (refgw: Gateway-Signature,
// stripegw: Stripe-Signature), and cmd builds it beside the Gateway from the same settings, so
// the HTTP receiver names no gateway: it hands over the header the verifier names, the raw body
// and the time, and gets an event or a refusal.
//
// A verifier holds every secret configured (GATEWAY_WEBHOOK_SECRET is a comma-separated list): a
// signature under any of them is accepted, so the old and the new secret both verify while a
// secret is being rotated.
type WebhookVerifier interface {
	// SignatureHeader names the HTTP header the gateway signs its deliveries in.
	SignatureHeader() string
	// VerifyEvent verifies header (the value of SignatureHeader, "" when absent) over the raw
	// body at now, then reads the event. It must be given the body byte for byte as received.
	// Refusals are domain errors: EMALFORMED for a missing or unreadable header or an event
	// that cannot be read, EBADSIGNATURE when no signature matches any secret or the signature
	// is older (or newer) than the gateway's tolerance.
	VerifyEvent(header string, body []byte, now time.Time) (GatewayEvent, error)
}

// EventOutcome is what became of one delivery of an event.
type EventOutcome string

const (
	// EventApplied: the gateway was asked and its answer applied through Check.
	EventApplied EventOutcome = "applied"
	// EventUnknownPayment: no session of ours has that gateway payment or reference.
	EventUnknownPayment EventOutcome = "unknown_payment"
	// EventIgnored: the event concerns no payment.
	EventIgnored EventOutcome = "ignored"
	// EventDuplicate: an earlier delivery of the same event processed it, or is processing it
	// right now; this one changed nothing and asked the gateway nothing.
	EventDuplicate EventOutcome = "duplicate"
	// EventQueued: recorded, but applying it failed this time (the gateway did not answer the
	// check, a lock wait timed out); the patrol applies it on its retry schedule, whether or not
	// the gateway delivers it again.
	EventQueued EventOutcome = "queued"
)

// EventResult is the outcome of HandleGatewayEvent.
type EventResult struct {
	Outcome EventOutcome
	Session Session // for EventApplied: the session as the gateway's answer left it
}

// How long one delivery (or the patrol's retry) may work on an event before another may take it
// over (its holder is then presumed dead) is the patrol's lease, Config.LeaseDuration
// (LeaseFor: 6 × GATEWAY_TIMEOUT): an apply is a status read, a lock wait and, for a stale
// answer, the gateway asked again, which outlasted the 2 × timeout + 10 s claim it had before
// (an outside review: the patrol's retry applied the event beside a slow delivery). Only the
// claim's holder marks the event processed.

// HandleGatewayEvent processes one delivery of a verified gateway event:
//
//  1. Record the event (unique per gateway and event id) and claim it, in one statement. A copy
//     whose event is already processed, or claimed by a delivery still working on it, returns
//     EventDuplicate at once: no gateway call, no effect.
//  2. Apply it as a hint through ApplyGatewayHint: find the session by gateway payment id (or by
//     our reference when the registration's answer, and so the id, was lost), ask the gateway
//     what the payment is now and apply that under the usual order → session locks and ledger
//     rule. So the 20th copy of "succeeded", or a late "authorized" after "succeeded", changes
//     nothing, and a success for a Canceled session becomes a late-payment case.
//  3. Mark the event processed. If applying failed (gateway down, lock timeout), the event is
//     NOT marked processed: the claim is released with the error recorded and the patrol's next
//     try (webhookSource), and the delivery is answered EventQueued: the event is ours now (the
//     contract: "a valid event → 200"), and a redelivery, if one comes, may apply it sooner.
//     Only an event that could not be recorded returns an error (the receiver's 5xx).
//
// An event whose id or payment id is longer than MaxGatewayIDLen is refused (EMALFORMED) before
// step 1: nothing is written and the gateway is asked nothing.
//
// An event for a payment no session of ours knows is recorded as EventUnknownPayment and logged;
// it is not a finance case here: gateway accounts are often shared (other shops, a staging
// environment), and reconciliation, which sees all of the gateway's payments, is where a payment
// carrying our reference without a session is judged. An event for a second gateway payment of
// a session we know (a gateway that ignored our idempotency key) does open a case
// (CaseDuplicatePayment): the customer may have been charged twice.
func (s *Service) HandleGatewayEvent(ctx context.Context, ev GatewayEvent) (EventResult, error) {
	if ev.ID == "" {
		return EventResult{}, Invalid("id", "the event has no id")
	}
	// Refused before anything is written, like any event that cannot be read (400): an id longer
	// than any gateway's, which past about 2,700 bytes no index of the inbox can hold
	// (MaxGatewayIDLen).
	switch {
	case len(ev.ID) > MaxGatewayIDLen:
		return EventResult{}, Errorf(EMALFORMED, "the event id has %d bytes; a gateway id has at most %d", len(ev.ID), MaxGatewayIDLen)
	case len(ev.PaymentID) > MaxGatewayIDLen:
		return EventResult{}, Errorf(EMALFORMED, "the event's payment id has %d bytes; a gateway id has at most %d", len(ev.PaymentID), MaxGatewayIDLen)
	}
	// The gateway may hang up: what we started must be recorded. But not for longer than the
	// claim this delivery takes on the event: past it the patrol may apply the event beside it,
	// and a database that does not answer held the delivery (its goroutine and a connection slot)
	// for as long as it did not answer.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LeaseDuration)
	defer cancel()
	ctx, span := s.startSpan(ctx, "payments.webhook", "", "")
	defer span.End()
	span.SetAttributes(attrEventID.String(ev.ID), attrEventType.String(ev.Type))
	now := s.cfg.Clock.Now()
	token := uuid.NewString()
	var (
		rowID     int64
		mine      bool
		processed bool
	)
	err := s.db.QueryRow(ctx, `
		INSERT INTO webhook_events AS w (gateway, event_id, event_type, gateway_payment_id, reference,
			received_at, last_received_at, claim_token, claimed_until)
		VALUES ($1, $2, $3, nullif($4, ''), nullif($5, ''), $6, $6, $7, $8)
		ON CONFLICT (gateway, event_id) DO UPDATE SET
			deliveries = w.deliveries + 1,
			last_received_at = $6,
			claim_token = CASE WHEN w.processed_at IS NULL AND (w.claimed_until IS NULL OR w.claimed_until <= $6)
				THEN $7::uuid ELSE w.claim_token END,
			claimed_until = CASE WHEN w.processed_at IS NULL AND (w.claimed_until IS NULL OR w.claimed_until <= $6)
				THEN $8::timestamptz ELSE w.claimed_until END
		RETURNING w.id, coalesce(w.claim_token = $7::uuid, false), w.processed_at IS NOT NULL`,
		s.gw.Name(), ev.ID, ev.Type, ev.PaymentID, ev.Reference, now, token, now.Add(s.cfg.LeaseDuration)).
		Scan(&rowID, &mine, &processed)
	if err != nil {
		return EventResult{}, dbError("webhook: record event", err, "")
	}
	if processed || !mine {
		return EventResult{Outcome: EventDuplicate}, nil
	}
	res, err := s.processEvent(ctx, rowID, token, ev)
	if err != nil {
		// Recorded, claim released with its retry time (or, if even that failed, running out
		// at claimed_until): the patrol applies it.
		s.log.Warn("webhook: apply failed; the patrol retries the event", "event", ev.ID, "err", err)
		return EventResult{Outcome: EventQueued}, nil
	}
	return res, nil
}

// processEvent is steps 2 and 3 of HandleGatewayEvent for an event whose claim (token) this
// caller holds: a delivery, or the patrol's retry (webhookSource). A failed apply releases the
// claim with its error and the time of the patrol's next try (the looks' schedule by attempts,
// at most maxWebhookRetryWait).
func (s *Service) processEvent(ctx context.Context, rowID int64, token string, ev GatewayEvent) (EventResult, error) {
	var res EventResult
	err := s.panicAsError("webhook: apply", func() (err error) {
		res, err = s.applyEvent(ctx, ev)
		return err
	})
	cut := err != nil && stopped(ctx)
	ctx, cancel := Outlive(ctx, RecordGrace) // what was done must be recorded, within its grace
	defer cancel()
	if cut {
		// The patrol's stop cut the retry (a delivery's apply is not cut by its request's end,
		// only at its claim's end, and is then a failed try): the event goes back due as it
		// was, no attempt counted and its next try not put off, for another replica's next round.
		if _, xerr := s.db.Exec(ctx, `UPDATE webhook_events SET claim_token = NULL, claimed_until = NULL
			WHERE id = $1 AND claim_token = $2`, rowID, token); xerr != nil {
			s.log.Error("webhook: give back", "event", ev.ID, "err", xerr)
		}
		return EventResult{}, err
	}
	if err != nil {
		if _, xerr := s.db.Exec(ctx, `UPDATE webhook_events SET claim_token = NULL, claimed_until = NULL, error = $3,
			attempts = attempts + 1,
			retry_at = $4::timestamptz + least(($5::interval[])[least(attempts + 1, cardinality($5::interval[]))], $6::interval)
			WHERE id = $1 AND claim_token = $2`, rowID, token, truncate(err.Error(), 2000), s.cfg.Clock.Now(), s.cfg.Backoff, maxWebhookRetryWait); xerr != nil {
			s.log.Error("webhook: release claim", "event", ev.ID, "err", xerr)
		}
		return EventResult{}, err
	}
	var sid any
	if res.Session.ID != "" {
		sid = res.Session.ID
	}
	// Marked only by the claim's holder: a holder that outlived its claim (another took the event
	// over) applied a hint Check makes harmless, and leaves the record to the one that holds it.
	if _, err := s.db.Exec(ctx, `UPDATE webhook_events SET processed_at = $2, outcome = $3, session_id = $4,
		error = NULL, claim_token = NULL, claimed_until = NULL, retry_at = NULL
		WHERE id = $1 AND processed_at IS NULL AND claim_token = $5`, rowID, s.cfg.Clock.Now(), string(res.Outcome), sid, token); err != nil {
		// Applied but not marked: the next delivery or retry applies the hint again, which Check
		// makes harmless.
		return EventResult{}, fmt.Errorf("webhook: mark processed: %w", err)
	}
	return res, nil
}

// maxWebhookRetryWait caps the wait between the patrol's tries of a failed event: the looks'
// schedule grows to a day, and an event that failed through a long gateway outage must be
// applied within minutes of the gateway's return, not a day later (its alert fires meanwhile).
const maxWebhookRetryWait = 5 * time.Minute

// RetryWebhooksOnce is one round of the patrol over failed webhook events only (tests).
func (s *Service) RetryWebhooksOnce(ctx context.Context) (int, error) {
	rep, err := s.runRound(ctx, []patrolSource{s.webhookSource()}, nil, 0)
	return rep.Driven, err
}

// webhookSource is the patrol's work on the webhook inbox: events of this gateway not processed,
// whose retry is due (a failed apply's retry_at; a delivery that died: its claim ran out) and
// that no delivery holds. Each is applied as its delivery would have been (processEvent), so an
// event is applied even when the gateway never delivers it again: it may have counted the 200
// a copy got while the first delivery was still applying as the event delivered.
func (s *Service) webhookSource() patrolSource {
	return patrolSource{kind: "webhook", gateway: true, claim: func(ctx context.Context, limit int) ([]patrolJob, error) {
		now := s.cfg.Clock.Now()
		rows, err := s.db.Query(ctx, `
			UPDATE webhook_events SET claim_token = gen_random_uuid(), claimed_until = $3
			WHERE id = ANY(ARRAY(
				SELECT id FROM webhook_events
				WHERE processed_at IS NULL AND coalesce(retry_at, received_at) <= $1
				  AND (claimed_until IS NULL OR claimed_until <= $1) AND gateway = $4
				ORDER BY coalesce(retry_at, received_at)
				LIMIT $2
				FOR UPDATE SKIP LOCKED))
			RETURNING id, claim_token::text, event_id, event_type, coalesce(gateway_payment_id, ''), coalesce(reference, '')`,
			now, limit, now.Add(s.cfg.LeaseDuration), s.gw.Name())
		if err != nil {
			return nil, fmt.Errorf("webhook retry: claim: %w", err)
		}
		defer rows.Close()
		var jobs []patrolJob
		for rows.Next() {
			var id int64
			var token string
			var ev GatewayEvent
			if err := rows.Scan(&id, &token, &ev.ID, &ev.Type, &ev.PaymentID, &ev.Reference); err != nil {
				return nil, fmt.Errorf("webhook retry: claim: %w", err)
			}
			jobs = append(jobs, patrolJob{id: fmt.Sprintf("webhook:%d", id), token: token, leasedAt: now, run: func(ctx context.Context) driveEnd {
				if _, err := s.processEvent(ctx, id, token, ev); err != nil {
					s.log.Warn("webhook retry: the event's apply failed again", "event", ev.ID, "err", err)
				}
				return endDone
			}})
		}
		return jobs, rows.Err()
	}}
}

// applyEvent is step 2 of HandleGatewayEvent.
func (s *Service) applyEvent(ctx context.Context, ev GatewayEvent) (EventResult, error) {
	if ev.PaymentID == "" {
		return EventResult{Outcome: EventIgnored}, nil
	}
	actor := Actor{Kind: ActorWebhook, ID: ev.ID}
	sess, err := s.ApplyGatewayHint(ctx, actor, ev.PaymentID, ev.Reference)
	if ErrorCode(err) == ENOTFOUND && ev.Reference == "" {
		// The event names only the gateway's id (Stripe) and no session has that id yet: the
		// registration's answer may have been lost. Ask the gateway for the payment's reference.
		started := time.Now()
		gp, gerr := s.gw.Status(ctx, ev.PaymentID)
		s.logGatewayCall(ctx, "", "status", "", started, gerr)
		switch {
		case gatewayNotFound(gerr):
			// The gateway does not know it either: nothing to apply.
		case gerr != nil:
			return EventResult{}, eventUnanswered(gerr)
		case gp.Reference != "":
			sess, err = s.applyHint(ctx, actor, ev.PaymentID, gp.Reference, &gp)
		}
	}
	switch {
	case ErrorCode(err) == ENOTFOUND:
		s.log.Warn("webhook: event for a payment no session knows", "event", ev.ID, "type", ev.Type,
			"gateway_payment", ev.PaymentID, "reference", ev.Reference)
		return EventResult{Outcome: EventUnknownPayment}, nil
	case err != nil:
		return EventResult{}, err
	}
	if sess.GatewayPaymentID != "" && sess.GatewayPaymentID != ev.PaymentID {
		if err := s.secondPayment(ctx, sess, ev); err != nil {
			return EventResult{}, err
		}
	}
	return EventResult{Outcome: EventApplied, Session: sess}, nil
}

// secondPayment is an event about a payment that carries sess's reference but is not the one
// it is attached to (a gateway that ignored our key made two): read by its id, it is noted as
// every path notes it (noteSecondPayment): the session's duplicate case with the facts
// reconciliation and Check give it (duplicateFacts), or, holding money for a Failed or Canceled
// session, its late_payment case.
// Without them, a duplicate finance had resolved came back at the next reconciliation, a payment
// that took nothing opened a case, and money held for a Failed session opened a duplicate case
// beside its late_payment case: one sum, two cases (an outside review). noteCase: the open case
// may be about the same payment still pending, and its capture is news. A payment the gateway
// does not know opens the case with it as missing (missingFact).
func (s *Service) secondPayment(ctx context.Context, sess Session, ev GatewayEvent) error {
	started := time.Now()
	gp, gerr := s.gw.Status(ctx, ev.PaymentID)
	s.logGatewayCall(ctx, sess.ID, "status", "", started, gerr)
	switch {
	case gatewayNotFound(gerr):
		s.log.Warn("webhook: second gateway payment for a session", "session", sess.ID, "gateway_payment", ev.PaymentID,
			"session_gateway_payment", sess.GatewayPaymentID)
		detail := fmt.Sprintf("gateway payment %s carries this session's reference but the session is paid through %s (event %s)",
			ev.PaymentID, sess.GatewayPaymentID, ev.ID)
		// Its fact is the payment the gateway does not know: the same news again (the event
		// redelivered once `pitlane prune` removed its inbox row, the gateway's retries run for
		// days) is finance's resolved case, not a new one (a review of retention).
		return s.inTx(ctx, "webhook: duplicate case", func(tx pgx.Tx) error {
			return noteCase(ctx, tx, sess.ID, sess.OrderID, CaseDuplicatePayment, detail, s.cfg.Clock.Now(), missingFact(ev.PaymentID))
		})
	case gerr != nil:
		return eventUnanswered(gerr)
	}
	// Money held for a session that is over goes to its late_payment case, opened here and now
	// (reconciliation looks back only so far: a session that failed long ago was never compared
	// again, and the review of this change found the charge reaching nobody).
	return s.inTx(ctx, "webhook: second payment", func(tx pgx.Tx) error {
		noted, err := noteSecondPayment(ctx, tx, sess, gp, ev.ID, s.cfg.Clock.Now())
		if noted && err == nil {
			s.log.Warn("webhook: second gateway payment for a session", "session", sess.ID, "gateway_payment", ev.PaymentID,
				"session_gateway_payment", sess.GatewayPaymentID)
		}
		return err
	})
}

// WebhookEvent is one row of the webhook inbox, for the console and tests.
type WebhookEvent struct {
	ID               int64
	Gateway          string
	EventID          string
	Type             string
	GatewayPaymentID string
	Reference        string
	SessionID        string
	Deliveries       int
	ReceivedAt       time.Time
	ProcessedAt      *time.Time
	Outcome          string
	Error            string
}

// WebhookEvents lists the most recent events of the inbox, newest first.
func (s *Service) WebhookEvents(ctx context.Context, limit int) ([]WebhookEvent, error) {
	rows, err := s.db.Query(ctx, `SELECT id, gateway, event_id, event_type, coalesce(gateway_payment_id, ''),
		coalesce(reference, ''), coalesce(session_id::text, ''), deliveries, received_at, processed_at,
		coalesce(outcome, ''), coalesce(error, '')
		FROM webhook_events ORDER BY received_at DESC, id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("webhook events: %w", err)
	}
	defer rows.Close()
	var out []WebhookEvent
	for rows.Next() {
		var w WebhookEvent
		if err := rows.Scan(&w.ID, &w.Gateway, &w.EventID, &w.Type, &w.GatewayPaymentID, &w.Reference, &w.SessionID,
			&w.Deliveries, &w.ReceivedAt, &w.ProcessedAt, &w.Outcome, &w.Error); err != nil {
			return nil, fmt.Errorf("webhook events: %w", err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("webhook events: %w", err)
	}
	return out, nil
}

// truncate is s as text PostgreSQL stores (storable), cut to at most n bytes on a character's
// boundary.
func truncate(s string, n int) string {
	s = storable(s)
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
