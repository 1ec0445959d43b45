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
	err := tx.QueryRow(ctx, `INSERT INTO outbox (kind, to_addr, body, order_id, payment_id, created_at)
		VALUES ($1, $2, $3, nullif($4, ''), $5, $6) RETURNING id`, m.Kind, m.To, m.Text, m.OrderID, pid, now).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("outbox: %w", err)
	}
	return id, nil
}

// deliver hands one outbox message to the Notifier (when configured) and records the result.
// Failures stay in the outbox with the error; the message text is never logged (it may hold a code).
func (s *Service) deliver(ctx context.Context, outboxID int64, m Message) {
	if s.cfg.Notifier == nil {
		return
	}
	err := s.cfg.Notifier.Notify(ctx, m)
	now := s.cfg.Clock.Now()
	if err != nil {
		s.log.Warn("notify failed", "outbox_id", outboxID, "kind", m.Kind, "err", err)
		_, _ = s.db.Exec(context.WithoutCancel(ctx), `UPDATE outbox SET attempts = attempts + 1, last_error = $2 WHERE id = $1`, outboxID, err.Error())
		return
	}
	_, _ = s.db.Exec(context.WithoutCancel(ctx), `UPDATE outbox SET attempts = attempts + 1, delivered_at = $2, last_error = NULL WHERE id = $1`, outboxID, now)
}
