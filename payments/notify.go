package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// Message is a message to a customer (a one-time code, …). Its JSON is the contract's
// NOTIFY_WEBHOOK_URL body: {"to","kind","text","order_id","payment_id"}.
type Message struct {
	To        string `json:"to"`
	Kind      string `json:"kind"`
	Text      string `json:"text"`
	OrderID   string `json:"order_id"`
	PaymentID string `json:"payment_id"`
	// Redacted is Text without its secret (a one-time code), what the outbox keeps once the
	// message is delivered; "" when Text holds nothing secret. Never sent.
	Redacted string `json:"-"`
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
}

func (n WebhookNotifier) Notify(ctx context.Context, m Message) error {
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	c := n.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("notify: %s answered %d", n.URL, resp.StatusCode)
	}
	return nil
}

// enqueue writes a message to the outbox in the caller's transaction and returns its id.
func enqueue(ctx context.Context, tx pgx.Tx, m Message, now time.Time) (int64, error) {
	var id int64
	var pid any
	if m.PaymentID != "" {
		pid = m.PaymentID
	}
	err := tx.QueryRow(ctx, `INSERT INTO outbox (kind, to_addr, body, redacted_body, order_id, payment_id, created_at)
		VALUES ($1, $2, $3, nullif($4, ''), nullif($5, ''), $6, $7) RETURNING id`, m.Kind, m.To, m.Text, m.Redacted, m.OrderID, pid, now).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("outbox: %w", err)
	}
	return id, nil
}

// outboxAttempts bounds how often one message is tried.
const outboxAttempts = 5

// DeliverOutbox retries undelivered messages (NOTIFY_WEBHOOK_URL was down). Each message is
// claimed in a short transaction by pushing next_attempt_at into the future (SKIP LOCKED, so two
// replicas never send the same message at once) and sent after commit, with no lock held.
// One-time codes (messages with a redacted text) older than their TTL are not sent: a dead code
// is no use to anyone.
func (s *Service) DeliverOutbox(ctx context.Context) (int, error) {
	if s.cfg.Notifier == nil {
		return 0, nil
	}
	now := s.cfg.Clock.Now()
	type item struct {
		id int64
		m  Message
	}
	var items []item
	err := s.inTx(ctx, "outbox: claim", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			WITH due AS (
				SELECT id AS due_id FROM outbox
				WHERE delivered_at IS NULL AND attempts < $1 AND coalesce(next_attempt_at, created_at) <= $2
				  AND (redacted_body IS NULL OR created_at > $3)
				ORDER BY id LIMIT 50
				FOR UPDATE SKIP LOCKED
			)
			UPDATE outbox SET next_attempt_at = $2::timestamptz + interval '1 minute' * power(2, attempts)
			FROM due WHERE id = due.due_id
			RETURNING id, kind, to_addr, body, coalesce(order_id, ''), coalesce(payment_id::text, '')`,
			outboxAttempts, now, now.Add(-s.cfg.CodeTTL))
		if err != nil {
			return fmt.Errorf("outbox: claim: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var it item
			if err := rows.Scan(&it.id, &it.m.Kind, &it.m.To, &it.m.Text, &it.m.OrderID, &it.m.PaymentID); err != nil {
				return err
			}
			items = append(items, it)
		}
		return rows.Err()
	})
	if err != nil {
		return 0, err
	}
	for _, it := range items {
		s.deliver(ctx, it.id, it.m)
	}
	return len(items), nil
}

// deliver hands one outbox message to the Notifier (when configured) and records the result.
// Failures stay in the outbox with the error; the message text is never logged (it may hold a code).
// A delivered message keeps only its redacted text: the code reached the customer, and the
// outbox (which admins read) must not hold it in clear any longer.
func (s *Service) deliver(ctx context.Context, outboxID int64, m Message) {
	if s.cfg.Notifier == nil {
		return
	}
	err := s.cfg.Notifier.Notify(ctx, m)
	now := s.cfg.Clock.Now()
	if err != nil {
		s.log.Warn("notify failed", "outbox_id", outboxID, "kind", m.Kind, "err", err)
		if _, uerr := s.db.Exec(context.WithoutCancel(ctx), `UPDATE outbox SET attempts = attempts + 1, last_error = $2,
			next_attempt_at = coalesce(next_attempt_at, $3::timestamptz + interval '1 minute') WHERE id = $1`, outboxID, err.Error(), now); uerr != nil {
			s.log.Error("outbox: record failure", "outbox_id", outboxID, "err", uerr)
		}
		return
	}
	if _, uerr := s.db.Exec(context.WithoutCancel(ctx), `UPDATE outbox SET attempts = attempts + 1, delivered_at = $2, last_error = NULL,
		body = coalesce(redacted_body, body) WHERE id = $1`, outboxID, now); uerr != nil {
		s.log.Error("outbox: record delivery", "outbox_id", outboxID, "err", uerr)
	}
}
