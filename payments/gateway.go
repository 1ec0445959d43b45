package payments

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// GatewayStatus is a payment's status at the gateway (gateway-api.md).
type GatewayStatus string

const (
	GatewayPending    GatewayStatus = "pending"
	GatewayAuthorized GatewayStatus = "authorized"
	GatewaySucceeded  GatewayStatus = "succeeded"
	GatewayDeclined   GatewayStatus = "declined"
	GatewayExpired    GatewayStatus = "expired"
	GatewayReversed   GatewayStatus = "reversed"
)

// GatewayPayment is what the gateway says about one payment.
type GatewayPayment struct {
	ID              string
	Status          GatewayStatus
	Amount          int64
	Currency        string
	Reference       string
	ConfirmationURL string
	DeclineCode     string
	Created         time.Time
}

// RegisterRequest asks the gateway to create a payment. IdempotencyKey and Reference are derived
// from the session id, so a repeat after a lost answer cannot create a second gateway payment
// (with a gateway that honours keys), and a gateway that does not can still be searched.
type RegisterRequest struct {
	IdempotencyKey string
	Reference      string
	Amount         int64
	Currency       string
	ReturnURL      string
}

// GatewayRefund is what the gateway says about one refund.
type GatewayRefund struct {
	ID        string
	PaymentID string
	Amount    int64
	Status    string // succeeded | pending | failed
	// Currency is the refund's currency when the gateway's answer names one (Stripe's does;
	// the reference gateway's refund object has none: ""). An answer in another currency than
	// the payment's is about another refund (refundAnswerMismatch): its amount, converted by
	// that currency's decimals, is not ours to book.
	Currency string
}

// Gateway is what the locking core needs from a payment gateway. Implementations: the reference
// gateway client (payments/gateway/refgw), Stripe (payments/gateway/stripegw), and the fake in
// tests. Every error an implementation returns must be a *GatewayError (or wrap one) so the
// core can tell "refused" from "may have happened".
type Gateway interface {
	// Name identifies the gateway in rows ("refgw", "stripe", "fake").
	Name() string
	Register(ctx context.Context, req RegisterRequest) (GatewayPayment, error)
	Status(ctx context.Context, gatewayPaymentID string) (GatewayPayment, error)
	// FindByReference lists the gateway's payments carrying our reference, newest first.
	FindByReference(ctx context.Context, reference string) ([]GatewayPayment, error)
	// Reverse voids a not-yet-captured payment. A payment that can no longer be reversed is a
	// definitive error with Code "not_reversible" and GatewayStatus set when known.
	Reverse(ctx context.Context, gatewayPaymentID, idempotencyKey string) (GatewayPayment, error)
	// Refund refunds amount (minor units of currency, the payment's ISO 4217 currency: an
	// adapter whose gateway counts a currency in other units converts it).
	Refund(ctx context.Context, gatewayPaymentID, idempotencyKey string, amount int64, currency string) (GatewayRefund, error)
	// RefundStatus reads a refund the gateway told us about (by its id), making nothing.
	RefundStatus(ctx context.Context, gatewayRefundID string) (GatewayRefund, error)
	// FindRefund looks for the refund of a payment made with idempotencyKey, making nothing:
	// how a refund whose answer was lost is found once the gateway may have forgotten the key.
	// found=false: the gateway has no such refund — the core then asks for it again, so an
	// adapter whose search stopped before it saw every refund of the payment answers an
	// unknown error instead (stripegw: Code "search_incomplete"). A gateway that cannot search
	// answers a definitive error with Code "unsupported".
	FindRefund(ctx context.Context, gatewayPaymentID, idempotencyKey string) (GatewayRefund, bool, error)
	// KeyRetention is how long the gateway honours an idempotency key (Stripe: 24 hours); after
	// it, a request repeated with the same key may act a second time. 0: as long as the payment.
	KeyRetention() time.Duration
}

// FailureKind sorts every gateway failure into exactly one of three boxes.
type FailureKind string

const (
	// FailureDefinitive: the gateway answered and refused (a 4xx). It did not act.
	FailureDefinitive FailureKind = "definitive"
	// FailureUnknown: timeout, 5xx, connection broken after the request was written. The gateway
	// may have acted; only asking it later tells. Never treat as Failed.
	FailureUnknown FailureKind = "unknown"
	// FailureNotSent: nothing reached the gateway (connection refused before writing). Safe to
	// retry, and certain that nothing happened.
	FailureNotSent FailureKind = "not_sent"
)

// GatewayError is the error every Gateway returns.
type GatewayError struct {
	Kind       FailureKind
	Op         string // register, status, find, reverse, refund
	HTTPStatus int    // 0 when there was no answer
	Code       string // the gateway's error code, e.g. "not_reversible", "not_found"
	// GatewayStatus is the payment's status when the gateway said it (not_reversible carries it).
	GatewayStatus GatewayStatus
	Err           error
}

func (e *GatewayError) Error() string {
	s := fmt.Sprintf("gateway %s: %s", e.Op, e.Kind)
	if e.HTTPStatus != 0 {
		s += fmt.Sprintf(" (HTTP %d)", e.HTTPStatus)
	}
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	// Stored as the call's log detail and in reasons, inside the apply transaction: a NUL the
	// gateway's TLS certificate or error code carried failed the whole statement (storable).
	return storable(s)
}

func (e *GatewayError) Unwrap() error { return e.Err }

// FailureOf classifies any error from a Gateway. An error that is not a *GatewayError (a bug
// in an adapter, a context deadline) counts as unknown: when in doubt, the gateway may have acted.
func FailureOf(err error) FailureKind {
	if err == nil {
		return ""
	}
	var ge *GatewayError
	if errors.As(err, &ge) {
		return ge.Kind
	}
	return FailureUnknown
}

// GatewayErrorCode returns the gateway's error code ("not_reversible", …) or "", as text a
// column stores (storable): it goes into a refund's detail and a transition's reason, and a code
// carrying a NUL left a refused refund Pending and a refused reverse's cancel Canceling for ever,
// each write refused (a review of f9dd848). The adapters compare GatewayError.Code itself.
func GatewayErrorCode(err error) string {
	var ge *GatewayError
	if errors.As(err, &ge) {
		return storable(ge.Code)
	}
	return ""
}

// gatewayNotFound reports a definitive answer that the gateway has no such payment (or refund):
// not a timeout or a 5xx, which say nothing.
func gatewayNotFound(err error) bool {
	return FailureOf(err) == FailureDefinitive && GatewayErrorCode(err) == "not_found"
}

// eventUnanswered is the refusal of a gateway event whose payment the gateway did not tell us
// about (gerr): the event stays unprocessed, for the patrol's retry.
func eventUnanswered(gerr error) error {
	return &Error{Code: EUNAVAIL, Message: "the gateway did not answer; the event stays unprocessed", Err: gerr}
}

// CodeOtherGateway is the GatewayError code of a call not sent because the payment was
// registered at another gateway than this replica's (gwOf).
const CodeOtherGateway = "other_gateway"

// gwOf is the gateway to ask about sess: the service's, or, for a session registered at another
// gateway (GATEWAY changed on a database with payments under way), one that sends nothing and
// answers every call "not sent" (CodeOtherGateway). Asked at the new gateway, such a session was
// registered there again (a second payment for one session), its refund sent where its money is
// not (an outside review, stripe). A replica of its own gateway looks after it.
func (s *Service) gwOf(sess Session) Gateway {
	if s.gw == nil || sess.Gateway == "" || sess.Gateway == s.gw.Name() {
		return s.gw
	}
	return otherGateway{Gateway: s.gw, at: sess.Gateway}
}

// otherGateway is gwOf's gateway for a session of another one.
type otherGateway struct {
	Gateway        // Name and KeyRetention: this replica's
	at      string // the session's gateway
}

func (g otherGateway) refuse(op string) *GatewayError {
	return &GatewayError{Kind: FailureNotSent, Op: op, Code: CodeOtherGateway,
		Err: fmt.Errorf("the payment was registered at gateway %q; this replica's is %q: a replica with GATEWAY=%s looks after it", g.at, g.Name(), g.at)}
}

func (g otherGateway) Register(context.Context, RegisterRequest) (GatewayPayment, error) {
	return GatewayPayment{}, g.refuse("register")
}

func (g otherGateway) Status(context.Context, string) (GatewayPayment, error) {
	return GatewayPayment{}, g.refuse("status")
}

func (g otherGateway) FindByReference(context.Context, string) ([]GatewayPayment, error) {
	return nil, g.refuse("find")
}

func (g otherGateway) Reverse(context.Context, string, string) (GatewayPayment, error) {
	return GatewayPayment{}, g.refuse("reverse")
}

func (g otherGateway) Refund(context.Context, string, string, int64, string) (GatewayRefund, error) {
	return GatewayRefund{}, g.refuse("refund")
}

func (g otherGateway) RefundStatus(context.Context, string) (GatewayRefund, error) {
	return GatewayRefund{}, g.refuse("refund_status")
}

func (g otherGateway) FindRefund(context.Context, string, string) (GatewayRefund, bool, error) {
	return GatewayRefund{}, false, g.refuse("find_refund")
}
