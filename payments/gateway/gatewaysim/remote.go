package gatewaysim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Remote drives a simulator over its /_sim control API, for tests and demos that talk to a
// simulator in another process (or that want to exercise the control API itself).
type Remote struct {
	base string
	hc   *http.Client
}

// NewRemote returns a control client for the simulator at baseURL. hc may be nil.
func NewRemote(baseURL string, hc *http.Client) *Remote {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Remote{base: trimSlash(baseURL), hc: hc}
}

func (c *Remote) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("gatewaysim control %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("gatewaysim control %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorJSON
		_ = json.Unmarshal(raw, &e)
		return &RemoteError{Method: method, Path: path, HTTPStatus: resp.StatusCode, Code: e.Error, Message: e.Message}
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// RemoteError is a refusal from the control API.
type RemoteError struct {
	Method, Path string
	HTTPStatus   int
	Code         string
	Message      string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("gatewaysim control %s %s: HTTP %d %s: %s", e.Method, e.Path, e.HTTPStatus, e.Code, e.Message)
}

// State returns the simulator's state.
func (c *Remote) State(ctx context.Context) (StateJSON, error) {
	var st StateJSON
	err := c.do(ctx, http.MethodGet, "/_sim/state", nil, &st)
	return st, err
}

// SetFaults replaces the faults of op ("all" for every operation).
func (c *Remote) SetFaults(ctx context.Context, op Op, f Faults) error {
	return c.do(ctx, http.MethodPost, "/_sim/faults/"+url.PathEscape(string(op)), faultsToJSON(f), nil)
}

// SetIgnoreIdempotencyKeys switches keys-ignored mode.
func (c *Remote) SetIgnoreIdempotencyKeys(ctx context.Context, on bool) error {
	return c.do(ctx, http.MethodPost, "/_sim/ignore-idempotency-keys", map[string]bool{"enabled": on}, nil)
}

// Pause parks calls of op until Release.
func (c *Remote) Pause(ctx context.Context, op Op) error {
	return c.do(ctx, http.MethodPost, "/_sim/pause/"+url.PathEscape(string(op)), nil, nil)
}

// Release lets parked calls of op continue.
func (c *Remote) Release(ctx context.Context, op Op) error {
	return c.do(ctx, http.MethodPost, "/_sim/release/"+url.PathEscape(string(op)), nil, nil)
}

// WaitParked returns once at least n calls of op are parked. The wait is bounded by ctx's
// deadline (at most one minute per request; it is repeated until ctx ends).
func (c *Remote) WaitParked(ctx context.Context, op Op, n int) error {
	return c.longPoll(ctx, fmt.Sprintf("/_sim/wait/parked/%s?count=%d", url.PathEscape(string(op)), n))
}

// WaitIdle returns once no call of op is being handled.
func (c *Remote) WaitIdle(ctx context.Context, op Op) error {
	return c.longPoll(ctx, "/_sim/wait/idle/"+url.PathEscape(string(op)))
}

// WebhooksIdle returns once nothing is queued or in flight.
func (c *Remote) WebhooksIdle(ctx context.Context) error {
	return c.longPoll(ctx, "/_sim/wait/webhooks")
}

func (c *Remote) longPoll(ctx context.Context, path string) error {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	for {
		timeout := time.Minute
		if dl, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(dl))
		}
		if timeout <= 0 {
			return context.DeadlineExceeded
		}
		err := c.do(ctx, http.MethodPost, path+sep+"timeout="+timeout.String(), nil, nil)
		var re *RemoteError
		if errors.As(err, &re) && re.HTTPStatus == http.StatusGatewayTimeout && ctx.Err() == nil {
			continue
		}
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
}

// Calls returns the call counts.
func (c *Remote) Calls(ctx context.Context) (Calls, error) {
	var calls Calls
	err := c.do(ctx, http.MethodGet, "/_sim/calls", nil, &calls)
	return calls, err
}

// Payments returns every payment (or those with reference, if not empty), newest first.
func (c *Remote) Payments(ctx context.Context, reference string) ([]SimPaymentJSON, error) {
	path := "/_sim/payments"
	if reference != "" {
		path += "?reference=" + url.QueryEscape(reference)
	}
	var list struct {
		Data []SimPaymentJSON `json:"data"`
	}
	err := c.do(ctx, http.MethodGet, path, nil, &list)
	return list.Data, err
}

// Approve, Decline, Succeed and Expire act on a payment as the Go methods do.
func (c *Remote) Approve(ctx context.Context, id string) error { return c.act(ctx, id, "approve", nil) }

// Decline declines a pending payment with code (default DefaultDeclineCode).
func (c *Remote) Decline(ctx context.Context, id, code string) error {
	return c.act(ctx, id, "decline", map[string]string{"decline_code": code})
}

// Succeed captures a pending or authorized payment.
func (c *Remote) Succeed(ctx context.Context, id string) error { return c.act(ctx, id, "succeed", nil) }

// Expire expires a pending payment.
func (c *Remote) Expire(ctx context.Context, id string) error { return c.act(ctx, id, "expire", nil) }

func (c *Remote) act(ctx context.Context, id, action string, body any) error {
	return c.do(ctx, http.MethodPost, "/_sim/payments/"+url.PathEscape(id)+"/"+action, body, nil)
}

// Tick applies the time rules now.
func (c *Remote) Tick(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/_sim/tick", nil, nil)
}

// SetWebhookFaults replaces the webhook faults.
func (c *Remote) SetWebhookFaults(ctx context.Context, f WebhookFaults) error {
	return c.do(ctx, http.MethodPost, "/_sim/webhooks", webhookFaultsToJSON(f), nil)
}

// FlushHeldWebhooks sends what Reorder holds.
func (c *Remote) FlushHeldWebhooks(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/_sim/webhooks/flush", nil, nil)
}

// Deliveries returns the delivery log.
func (c *Remote) Deliveries(ctx context.Context) ([]Delivery, error) {
	var out struct {
		Deliveries []Delivery `json:"deliveries"`
	}
	err := c.do(ctx, http.MethodGet, "/_sim/webhooks", nil, &out)
	return out.Deliveries, err
}

// Reset forgets everything.
func (c *Remote) Reset(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/_sim/reset", nil, nil)
}
