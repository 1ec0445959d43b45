package handlers

import (
	"context"
	"log/slog"
	"net/url"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/payments"
)

// API serves the public JSON API (/api/v1, contract: shared/contracts/pitlane-api.md). One file
// per action: api_create.go, api_payment.go, api_order.go, api_check.go, api_cancel.go,
// api_refund.go; request decoding and validation in api_decode.go, authentication in
// api_auth.go.
//
// Errors are returned, never written: web's one error handler turns them into
// application/problem+json with the status of their domain code.
type API struct {
	svc    *payments.Service
	access *access.Service
	idem   *payments.Idempotency
	log    *slog.Logger
}

// NewAPI builds the API handlers over the core and the API keys (both required: serve and dev
// always have them).
func NewAPI(svc *payments.Service, acc *access.Service, idem payments.IdempotencyConfig, log *slog.Logger) *API {
	if log == nil {
		log = slog.Default()
	}
	return &API{svc: svc, access: acc, idem: payments.NewIdempotency(svc, idem), log: log}
}

// Header names of the contract.
const (
	HeaderIdempotencyKey           = "Idempotency-Key"
	HeaderIdempotentReplayed       = "Idempotent-Replayed"
	paymentsPath                   = "/api/v1/payments/"
	maxAPIBody               int64 = 64 << 10 // the contract's 64 KiB
)

// paymentJSON is the contract's payment object. Field names are the contract's; empty gateway
// fields are null (not yet known), times are RFC 3339 in UTC.
type paymentJSON struct {
	ID               string       `json:"id"`
	OrderID          string       `json:"order_id"`
	Status           string       `json:"status"`
	Amount           int64        `json:"amount"`
	Currency         string       `json:"currency"`
	GatewayPaymentID *string      `json:"gateway_payment_id"`
	ConfirmationURL  *string      `json:"confirmation_url"`
	CreatedAt        time.Time    `json:"created_at"`
	UpdatedAt        time.Time    `json:"updated_at"`
	Links            paymentLinks `json:"links"`
}

type paymentLinks struct {
	Self string `json:"self"`
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func paymentLocation(id string) string { return paymentsPath + id }

// paymentJSON is the contract's payment object of s. A stored confirmation_url goes out only
// while a customer may still be sent to it (payments.Service.PayableConfirmationURL): shops send
// their customers to it.
func (a *API) paymentJSON(ctx context.Context, s payments.Session) (paymentJSON, error) {
	page, err := a.svc.PayableConfirmationURL(ctx, s)
	if err != nil {
		return paymentJSON{}, err
	}
	s.ConfirmationURL = page
	return paymentJSON{
		ID:               s.ID,
		OrderID:          s.OrderID,
		Status:           string(s.Status),
		Amount:           s.Amount,
		Currency:         s.Currency,
		GatewayPaymentID: nullable(s.GatewayPaymentID),
		ConfirmationURL:  nullable(s.ConfirmationURL),
		CreatedAt:        s.CreatedAt.UTC(),
		UpdatedAt:        s.UpdatedAt.UTC(),
		Links:            paymentLinks{Self: paymentLocation(s.ID)},
	}, nil
}

// writePayment answers with s's payment object.
func (a *API) writePayment(c echo.Context, status int, s payments.Session) error {
	p, err := a.paymentJSON(c.Request().Context(), s)
	if err != nil {
		return err
	}
	return writeJSON(c, status, p)
}

// writeJSON answers with a JSON body that no cache keeps (payment state changes under it).
func writeJSON(c echo.Context, status int, body any) error {
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(status, body)
}

// actor is the API client as the core's timeline records it.
func actor(c echo.Context) payments.Actor {
	return payments.Actor{Kind: payments.ActorAPI, ID: ClientFrom(c).ID}
}

// PathParam returns a path parameter decoded exactly once. Echo routes on the request's raw
// path when it has one (Go keeps URL.RawPath only when the path's escaping is not the default
// one, as %2F or %2E), so there a parameter still carries its %XX escapes; otherwise it routes on
// the decoded path and the parameter is decoded already. Decoding that one again read order
// o%2541 (the id "o%41", invalid) as order "oA" and created its payment (an outside review).
func PathParam(c echo.Context, name string) string {
	v := c.Param(name)
	if c.Request().URL.RawPath == "" {
		return v
	}
	if u, err := url.PathUnescape(v); err == nil {
		return u
	}
	return v
}
