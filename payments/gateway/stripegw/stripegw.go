// Package stripegw is the Stripe adapter of payments.Gateway: a pitlane payment session is one
// Stripe PaymentIntent.
//
// It speaks to Stripe through the official client (github.com/stripe/stripe-go/v82) rather than
// hand-written HTTP: the client owns the form encoding of nested params, the API version header and
// the error object, which are exactly the parts a hand-rolled client gets subtly wrong, and the tests
// run it against stripe-mock, which validates every request against Stripe's OpenAPI spec.
//
// Two things are deliberately NOT left to the client:
//   - retries: MaxNetworkRetries is 0. pitlane decides when to repeat a call (always with the same
//     idempotency key) and records every attempt; a library retrying behind its back would hide
//     attempts from the call log and spend the caller's time budget.
//   - classification: every failure is sorted into one payments.FailureKind here (see classify),
//     using what happened on the wire (did we get a connection? an HTTP status?) and not only the
//     error value stripe-go hands back.
//
// Mapping of the operations:
//
//	Register        POST /v1/payment_intents                 Idempotency-Key = our key
//	Status          GET  /v1/payment_intents/{id}
//	FindByReference GET  /v1/payment_intents/search          query metadata['reference']:'R'
//	Reverse         POST /v1/payment_intents/{id}/cancel      Idempotency-Key = our key
//	Refund          POST /v1/refunds                          Idempotency-Key = our key, metadata[pitlane_refund] = our key
//	RefundStatus    GET  /v1/refunds/{id}
//	FindRefund      GET  /v1/refunds?payment_intent=…         the one whose metadata[pitlane_refund] is our key (the newest 100; more: unknown)
package stripegw

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"

	"pitlane/payments"
)

// Name is what Gateway.Name returns and what session rows record.
const Name = "stripe"

// DefaultTimeout bounds one call when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// MetadataReference is the PaymentIntent metadata key carrying pitlane's reference. It is how a
// payment whose creation answer was lost is found again (FindByReference), and how reconciliation
// ties Stripe's payments to our sessions.
const MetadataReference = "reference"

// maxFound bounds FindByReference: one reference belongs to one session, so more than a handful
// of matches is already a finding for reconciliation, not something to page through forever.
// Stopping there cannot turn "something" into "nothing": it stops only after maxFound matches.
const maxFound = 100

// maxSearched bounds FindByReference's reading: results whose reference is not exactly ours
// (the search's quirks) are read past, and a search whose pages never end (a next_page that
// loops: a result listed again ends it too) read on until the caller's context ended — a session reconciliation could never get
// past (an outside review). Reaching it answers unknown ("search_incomplete"), never a
// shortened list: what is left unread may be ours, and "not found" may let a payment be made
// again.
const maxSearched = 1000

// maxRefundsListed bounds FindRefund: it reads at most this many of a PaymentIntent's refunds
// (newest first; one page of Stripe's list). A search that reaches the bound without finding ours
// has not looked at the older ones, so it answers unknown, never "not found" (see FindRefund).
const maxRefundsListed = 100

// Options configure the adapter.
type Options struct {
	// SecretKey is the Stripe secret key (sk_live_…, sk_test_…, or a restricted rk_… key allowed
	// to write PaymentIntents and Refunds). Required.
	SecretKey string
	// BaseURL is the API base URL; empty means https://api.stripe.com. Tests point it at stripe-mock.
	BaseURL string
	// Timeout bounds each call (http.Client.Timeout); zero means DefaultTimeout. The caller's
	// context deadline, when shorter, still wins.
	Timeout time.Duration
	// HTTPClient is the client to send requests with; nil means a client over
	// http.DefaultTransport. The adapter copies it (setting Timeout and wrapping its Transport to
	// observe each call), so the caller's value is never modified.
	HTTPClient *http.Client
	// Logger receives stripe-go's own request logs, all at debug level: every failure is also
	// returned as an error, and the caller is the one that logs it. Nil discards them. At debug
	// level stripe-go logs whole response bodies, client secrets included: troubleshooting only.
	Logger *slog.Logger
}

// Gateway is the Stripe implementation of payments.Gateway. It is safe for concurrent use and
// keeps no per-payment state.
type Gateway struct {
	sc *stripe.Client
}

var _ payments.Gateway = (*Gateway)(nil)

// New builds the adapter. It does not contact Stripe.
func New(opts Options) (*Gateway, error) {
	if opts.SecretKey == "" {
		return nil, errors.New("stripegw: SecretKey is required")
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("stripegw: negative Timeout %s", opts.Timeout)
	}
	baseURL := opts.BaseURL
	if baseURL == "" {
		baseURL = stripe.APIURL
	}
	timeout := cmp.Or(opts.Timeout, DefaultTimeout)

	hc := &http.Client{}
	if opts.HTTPClient != nil {
		c := *opts.HTTPClient
		hc = &c
	}
	hc.Timeout = timeout
	// A redirect is never followed: observingTransport turns every 3xx into a failure (unknown)
	// before the client could follow it.
	hc.Transport = &observingTransport{base: cmp.Or[http.RoundTripper](hc.Transport, http.DefaultTransport)}

	var logger stripe.LeveledLoggerInterface = &stripe.LeveledLogger{Level: stripe.LevelNull}
	if opts.Logger != nil {
		logger = debugLogger{opts.Logger}
	}

	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		HTTPClient:        hc,
		URL:               stripe.String(baseURL),
		MaxNetworkRetries: stripe.Int64(0), // pitlane retries itself, always with the same key
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     logger,
	})
	return &Gateway{sc: stripe.NewClient(opts.SecretKey, stripe.WithBackends(backends))}, nil
}

// Name implements payments.Gateway.
func (g *Gateway) Name() string { return Name }

// Register creates a PaymentIntent. The idempotency key makes a repeat after a lost answer return
// the same PaymentIntent (Stripe keeps keys for at least 24 hours; after that only
// FindByReference protects against a second one).
//
// The PaymentIntent is created unconfirmed with automatic payment methods: the customer confirms it
// on our checkout page with Stripe.js and its client secret. req.ReturnURL is therefore not sent:
// Stripe accepts return_url only together with confirm=true; it belongs to the confirmation on
// the client side.
func (g *Gateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	const op = "register"
	switch {
	case req.IdempotencyKey == "" || len(req.IdempotencyKey) > 255:
		return payments.GatewayPayment{}, invalid(op, "idempotency key must be 1–255 characters")
	case req.Reference == "":
		return payments.GatewayPayment{}, invalid(op, "reference is required")
	case req.Amount <= 0:
		return payments.GatewayPayment{}, invalid(op, "amount must be positive")
	case len(req.Currency) != 3:
		return payments.GatewayPayment{}, invalid(op, "currency must be an ISO 4217 code")
	}
	amount, err := toStripe(op, req.Amount, strings.ToUpper(req.Currency))
	if err != nil {
		return payments.GatewayPayment{}, err
	}
	params := &stripe.PaymentIntentCreateParams{
		Amount:   stripe.Int64(amount),
		Currency: stripe.String(strings.ToLower(req.Currency)),
		AutomaticPaymentMethods: &stripe.PaymentIntentCreateAutomaticPaymentMethodsParams{
			Enabled: stripe.Bool(true),
		},
		Metadata: map[string]string{MetadataReference: req.Reference},
	}
	params.SetIdempotencyKey(req.IdempotencyKey)

	ctx, ci := observe(ctx)
	pi, err := g.sc.V1PaymentIntents.Create(ctx, params)
	if err != nil {
		return payments.GatewayPayment{}, classify(op, ci, err)
	}
	return checkedPayment(op, pi)
}

// Status retrieves one PaymentIntent.
func (g *Gateway) Status(ctx context.Context, gatewayPaymentID string) (payments.GatewayPayment, error) {
	const op = "status"
	if gatewayPaymentID == "" {
		return payments.GatewayPayment{}, invalid(op, "payment id is required")
	}
	ctx, ci := observe(ctx)
	pi, err := g.sc.V1PaymentIntents.Retrieve(ctx, gatewayPaymentID, nil)
	if err != nil {
		return payments.GatewayPayment{}, classify(op, ci, err)
	}
	return checkedPayment(op, pi)
}

// FindByReference uses the PaymentIntent search API (metadata['reference']:'R'); stripe-mock
// serves that endpoint, and listing every PaymentIntent to filter locally would not scale.
//
// Stripe's search index is eventually consistent ("searchable in less than a minute", up to an
// hour during outages), so an empty answer right after a lost Register proves nothing: a caller
// must rely on the idempotency key first and treat "not found" as "not yet known" for a while.
// Results are filtered again by exact metadata equality (a query quirk can only cause a miss,
// never a wrong match) and sorted newest first.
func (g *Gateway) FindByReference(ctx context.Context, reference string) ([]payments.GatewayPayment, error) {
	const op = "find"
	if reference == "" {
		return nil, invalid(op, "reference is required")
	}
	params := &stripe.PaymentIntentSearchParams{}
	params.Query = searchQuery(reference)
	params.Limit = stripe.Int64(maxFound)

	ctx, ci := observe(ctx)
	var found []payments.GatewayPayment
	read := make(map[string]bool)
	for pi, err := range g.sc.V1PaymentIntents.Search(ctx, params) {
		if err != nil {
			return nil, classify(op, ci, err)
		}
		if read[pi.ID] || len(read) == maxSearched { // a page again (its cursor looped), or too many
			return nil, &payments.GatewayError{Kind: payments.FailureUnknown, Op: op, Code: "search_incomplete",
				Err: fmt.Errorf("the search for reference %s did not end: %d results read, %s listed again: %t", reference, len(read), pi.ID, read[pi.ID])}
		}
		read[pi.ID] = true
		if pi.Metadata[MetadataReference] != reference {
			continue
		}
		if _, err := checkedPayment(op, pi); err != nil {
			return nil, err
		}
		found = append(found, paymentOf(pi))
		if len(found) == maxFound {
			break
		}
	}
	slices.SortStableFunc(found, func(a, b payments.GatewayPayment) int {
		return cmp.Or(b.Created.Compare(a.Created), strings.Compare(b.ID, a.ID))
	})
	return found, nil
}

// searchQuery builds a Stripe Search Query Language clause matching our reference exactly.
// Single quotes inside the value are escaped with a backslash, as the query language requires.
func searchQuery(reference string) string {
	return "metadata['" + MetadataReference + "']:'" + strings.ReplaceAll(reference, "'", `\'`) + "'"
}

// Reverse cancels a PaymentIntent that has not been captured, with cancellation_reason
// requested_by_customer (pitlane reverses only when the customer read out their cancel code).
// A PaymentIntent that can no longer be canceled (succeeded, already canceled, processing) is a
// definitive error with Code "not_reversible" and GatewayStatus taken from the PaymentIntent that
// Stripe returns inside the error, so the caller learns the state without another call.
func (g *Gateway) Reverse(ctx context.Context, gatewayPaymentID, idempotencyKey string) (payments.GatewayPayment, error) {
	const op = "reverse"
	switch {
	case gatewayPaymentID == "":
		return payments.GatewayPayment{}, invalid(op, "payment id is required")
	case idempotencyKey == "" || len(idempotencyKey) > 255:
		return payments.GatewayPayment{}, invalid(op, "idempotency key must be 1–255 characters")
	}
	params := &stripe.PaymentIntentCancelParams{
		CancellationReason: stripe.String(string(stripe.PaymentIntentCancellationReasonRequestedByCustomer)),
	}
	params.SetIdempotencyKey(idempotencyKey)

	ctx, ci := observe(ctx)
	pi, err := g.sc.V1PaymentIntents.Cancel(ctx, gatewayPaymentID, params)
	if err != nil {
		return payments.GatewayPayment{}, classify(op, ci, err)
	}
	return checkedPayment(op, pi)
}

// Refund refunds part or all of a succeeded PaymentIntent.
func (g *Gateway) Refund(ctx context.Context, gatewayPaymentID, idempotencyKey string, amount int64, currency string) (payments.GatewayRefund, error) {
	const op = "refund"
	switch {
	case gatewayPaymentID == "":
		return payments.GatewayRefund{}, invalid(op, "payment id is required")
	case idempotencyKey == "" || len(idempotencyKey) > 255:
		return payments.GatewayRefund{}, invalid(op, "idempotency key must be 1–255 characters")
	case amount <= 0:
		return payments.GatewayRefund{}, invalid(op, "amount must be positive")
	}
	stripeAmount, err := toStripe(op, amount, strings.ToUpper(currency))
	if err != nil {
		return payments.GatewayRefund{}, err
	}
	params := &stripe.RefundCreateParams{
		PaymentIntent: stripe.String(gatewayPaymentID),
		Amount:        stripe.Int64(stripeAmount),
	}
	params.SetIdempotencyKey(idempotencyKey)
	// Stripe forgets idempotency keys after 24 hours; the key in the metadata is how FindRefund
	// finds this refund after that without making a second one.
	params.AddMetadata(MetadataRefundKey, idempotencyKey)

	ctx, ci := observe(ctx)
	r, err := g.sc.V1Refunds.Create(ctx, params)
	if err != nil {
		return payments.GatewayRefund{}, classify(op, ci, err)
	}
	return refundOf(r), nil
}

// MetadataRefundKey is the Refund metadata key carrying pitlane's idempotency key (its refund id).
const MetadataRefundKey = "pitlane_refund"

// KeyRetention implements payments.Gateway: Stripe keeps idempotency keys for 24 hours.
func (g *Gateway) KeyRetention() time.Duration { return 24 * time.Hour }

// RefundStatus reads one refund.
func (g *Gateway) RefundStatus(ctx context.Context, gatewayRefundID string) (payments.GatewayRefund, error) {
	const op = "refund_status"
	if gatewayRefundID == "" {
		return payments.GatewayRefund{}, invalid(op, "refund id is required")
	}
	ctx, ci := observe(ctx)
	r, err := g.sc.V1Refunds.Retrieve(ctx, gatewayRefundID, nil)
	if err != nil {
		return payments.GatewayRefund{}, classify(op, ci, err)
	}
	return refundOf(r), nil
}

// FindRefund lists the PaymentIntent's refunds and returns the one made with our key (its
// metadata), making nothing. A PaymentIntent has few refunds; the list is bounded all the same
// (maxRefundsListed, newest first).
//
// "Not found" is the core's licence to send the refund again (after Stripe forgot the key, a
// second refund), so it is answered only when Stripe listed every refund of the PaymentIntent.
// When there are more than the bound and ours is not among the newest, the search could not
// tell: an unknown failure (Code "search_incomplete"), on which the refund stays Pending and the
// patrol asks again until its schedule runs out and finance gets a refund_unsettled case. It
// used to answer "not found" there, and a payment with over 100 later refunds had the lost one
// paid twice (an outside review).
func (g *Gateway) FindRefund(ctx context.Context, gatewayPaymentID, idempotencyKey string) (payments.GatewayRefund, bool, error) {
	const op = "find_refund"
	if gatewayPaymentID == "" || idempotencyKey == "" {
		return payments.GatewayRefund{}, false, invalid(op, "payment id and key are required")
	}
	params := &stripe.RefundListParams{PaymentIntent: stripe.String(gatewayPaymentID)}
	params.Limit = stripe.Int64(maxRefundsListed)
	ctx, ci := observe(ctx)
	n := 0
	for r, err := range g.sc.V1Refunds.List(ctx, params) {
		if err != nil {
			return payments.GatewayRefund{}, false, classify(op, ci, err)
		}
		// The list goes on past the bound (Stripe had more to give: has_more on the page
		// before): what is left unread may be ours. Exactly maxRefundsListed refunds end the
		// loop instead, with nothing left unread.
		if n == maxRefundsListed {
			return payments.GatewayRefund{}, false, &payments.GatewayError{Kind: payments.FailureUnknown, Op: op, Code: "search_incomplete",
				Err: fmt.Errorf("PaymentIntent %s has more than %d refunds and none of the newest %d carries key %s", gatewayPaymentID, maxRefundsListed, maxRefundsListed, idempotencyKey)}
		}
		if r.Metadata[MetadataRefundKey] == idempotencyKey {
			return refundOf(r), true, nil
		}
		n++
	}
	return payments.GatewayRefund{}, false, nil
}

// refundOf translates a Refund as Stripe answered it: its PaymentIntent (an id, expanded or not;
// none for a refund of a bare charge) and its currency as they come. The PaymentIntent asked
// about filled in for one the answer did not name, a refund of another charge was read as ours,
// and the core's check of an answer naming no payment (refundAnswerMismatch) never saw it; the
// currency, dropped, let 500 JPY read as 5.00 EUR (a review of answers about other things).
func refundOf(r *stripe.Refund) payments.GatewayRefund {
	paymentID := ""
	if r.PaymentIntent != nil {
		paymentID = r.PaymentIntent.ID
	}
	currency := strings.ToUpper(string(r.Currency))
	return payments.GatewayRefund{
		ID:        r.ID,
		PaymentID: paymentID,
		Amount:    fromStripe(r.Amount, currency),
		Status:    refundStatus(r.Status),
		Currency:  currency,
	}
}

// paymentOf translates a PaymentIntent into what the core reads.
//
// Amount is what the core compares with the session before applying anything (a mismatch is a
// finance case, never a success): for a succeeded PaymentIntent it is amount_received, the money
// Stripe actually took (a partial capture takes less than amount); otherwise amount, what the
// payment is for. Stripe writes currencies in lower case; the contract's are upper case.
// checkedPayment is paymentOf of an answer that is a PaymentIntent: one without an id or a
// status (a hostile or broken endpoint at GATEWAY_URL) is unreadable, unknown, as refgw reads
// such an answer — with no id, the core's checks of a payment being attached have nothing to
// compare (an outside review, reconcile3).
func checkedPayment(op string, pi *stripe.PaymentIntent) (payments.GatewayPayment, error) {
	if pi == nil || pi.ID == "" || pi.Status == "" {
		return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureUnknown, Op: op,
			Err: errors.New("answer is not a PaymentIntent (no id or status)")}
	}
	return paymentOf(pi), nil
}

func paymentOf(pi *stripe.PaymentIntent) payments.GatewayPayment {
	p := payments.GatewayPayment{
		ID:        pi.ID,
		Status:    mapStatus(pi.Status, pi.CancellationReason),
		Currency:  strings.ToUpper(string(pi.Currency)),
		Reference: pi.Metadata[MetadataReference],
	}
	p.Amount = fromStripe(pi.Amount, p.Currency)
	if p.Status == payments.GatewaySucceeded {
		p.Amount = fromStripe(pi.AmountReceived, p.Currency)
	}
	if pi.Created != 0 {
		p.Created = time.Unix(pi.Created, 0).UTC()
	}
	if na := pi.NextAction; na != nil && na.RedirectToURL != nil {
		p.ConfirmationURL = na.RedirectToURL.URL
	}
	p.DeclineCode = declineCode(pi)
	return p
}

// declineCode says why the payment did not go through: the last attempt's decline code while
// the customer may still try again, or the cancellation reason of a PaymentIntent Stripe closed
// as declined.
func declineCode(pi *stripe.PaymentIntent) string {
	if pi.Status == stripe.PaymentIntentStatusCanceled && mapStatus(pi.Status, pi.CancellationReason) == payments.GatewayDeclined {
		return string(pi.CancellationReason)
	}
	if e := pi.LastPaymentError; e != nil {
		return string(cmp.Or[stripe.ErrorCode](stripe.ErrorCode(e.DeclineCode), e.Code))
	}
	return ""
}

// refundStatus folds Stripe's refund statuses into the contract's succeeded | pending | failed.
// requires_action (the customer must supply details for some payment methods) is still pending;
// canceled means no money moved, which the contract calls failed.
func refundStatus(s stripe.RefundStatus) string {
	switch s {
	case stripe.RefundStatusSucceeded:
		return "succeeded"
	case stripe.RefundStatusFailed, stripe.RefundStatusCanceled:
		return "failed"
	default: // pending, requires_action, anything new
		return "pending"
	}
}

// invalid is a request the adapter refuses before sending it: a caller bug that no retry can
// fix, so it is definitive (and certainly had no effect).
func invalid(op, msg string) error {
	return &payments.GatewayError{Kind: payments.FailureDefinitive, Op: op, Code: "invalid_request", Err: errors.New(msg)}
}

// debugLogger adapts slog to stripe-go's leveled logger, everything at debug level.
type debugLogger struct{ l *slog.Logger }

func (d debugLogger) Debugf(format string, v ...any) { d.log(format, v...) }
func (d debugLogger) Infof(format string, v ...any)  { d.log(format, v...) }
func (d debugLogger) Warnf(format string, v ...any)  { d.log(format, v...) }
func (d debugLogger) Errorf(format string, v ...any) { d.log(format, v...) }

func (d debugLogger) log(format string, v ...any) {
	d.l.Debug(fmt.Sprintf(format, v...), slog.String("component", "stripe-go"))
}
