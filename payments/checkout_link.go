package payments

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Checkout links: what a shop sends its customer to pay an order's first payment,
//
//	/checkout/{order_id}?amount=1999&currency=EUR&exp=1767225600&gen=0&gsig=<64 hex>&sig=<64 hex>
//
// The checkout page offers Pay for the amount and currency of a link only when sig is
// HMAC-SHA256(link key, "checkout-link/v2" 0 order_id 0 amount 0 currency 0 exp) and, when the
// link carries gen (the run of the order's price it was made in), gsig is HMAC-SHA256(link key,
// "checkout-link/v3" 0 order_id 0 amount 0 currency 0 exp 0 gen): a customer who edits the URL
// (1 cent instead of 19.99, a later expiry, a newer generation) gets no Pay form. A link without
// gen (made before generations, or with gen and gsig cut off) is judged by its amount and
// currency alone, as before (CheckoutPrice.Replaces). sig stays the release before's, so its
// replicas (a rolling deploy, a rollback) take the links this one makes. exp is when the link stops working (Unix seconds; DefaultCheckoutLinkTTL after it was
// made unless the shop asked for another lifetime): a link forwarded, leaked or found in a
// browser history a month later pays nothing, and says so (EEXPIRED, 410). The link key is derived from the service
// secret (HMAC(secret, "pitlane checkout-link key v1")), so a link signature and a one-time code
// hash (codeHash) are never values of the same function, whatever their inputs. The message is
// unambiguous: order ids and currencies cannot hold a 0 byte and the numbers are decimal. An
// order that is already paid offers no Pay form whatever the link says.
//
// The link itself is not stored: any replica with the same secret verifies any link (SECRET_KEY
// must be the same on every replica, as for CSRF tokens and cancel codes; SECRET_KEY_FALLBACKS
// verify too, which is how the secret rotates without breaking links in customers' hands).
// What is stored is the order's checkout price, the newest link's amount and currency
// (checkout_prices): a genuine link for another amount was replaced and pays nothing
// (ErrLinkReplaced), nor does the page's "try again" of a payment at the old price. A price
// change moves the price's generation on (migration 01040), and a link pays only in the
// generation it was made in: after 100 → 150 → 100 the first link at 100 stays replaced (it paid
// again for the rest of its own lifetime, past the shop's new short link: a review). With it is
// stored until when the price may be paid (valid_until, migration 00560): the latest expiry of
// the links made at that price, which bounds the page's "try again" too (CheckoutRetry).

// ErrLinkReplaced: the shop has made a newer link for this order with another amount or
// currency.
var ErrLinkReplaced = &Error{Code: ECONFLICT, Message: "the shop has changed this order's amount since this payment link was made; please use the newest link from the shop"}

// ErrNoCheckoutRetry: the order's page may not start another payment without a link, because
// no checkout link was ever made for the order (CheckoutRetry).
var ErrNoCheckoutRetry = &Error{Code: ECONFLICT, Message: "this payment can be started again only from the shop; please go back to the shop to pay"}

// ErrPaymentInReview: the gateway reported money for a payment of the order that finance has not
// resolved yet (paymentInReviewSQL's cases): it took money for a payment pitlane had settled
// Failed or Canceled, or its answer about a payment is not the session's amount or currency. The
// checkout starts no payment and sends no customer to the bank's page meanwhile: "try again" or
// "continue" would charge the customer a second time for an order whose money the gateway may
// already hold (CheckoutPay refuses it; the page offers no form, PaymentInReview).
var ErrPaymentInReview = &Error{Code: ECONFLICT, Message: "our bank reported a payment of this order that the shop is checking, so no new payment can be started here: you will not be charged twice"}

// PaymentInReview reports whether a payment of the order has an open case that says the gateway
// may hold the customer's money (ErrPaymentInReview). Through finance_cases_one_open: the
// order's sessions, each one index probe per kind.
func (s *Service) PaymentInReview(ctx context.Context, orderID string) (bool, error) {
	var open bool
	if err := s.db.QueryRow(ctx, paymentInReviewSQL, orderID).Scan(&open); err != nil {
		return false, dbError("payment in review", err, "")
	}
	return open, nil
}

// paymentInReviewSQL: $1's sessions have an open late_payment case (the gateway took money after
// pitlane settled the session), an open gateway_mismatch case (the gateway's word about a
// session is for another amount or currency: it may have taken 19.90 of a 19.99 session, which
// stays Registered and flagged; its page at the bank asks for what the session does not say), or
// an open duplicate_gateway_payment case about a payment holding money (gatewayFact's status:
// a second payment captured for a session under way; an outside review: the order's page offered
// a third payment while it sat in that case).
const paymentInReviewSQL = `SELECT EXISTS (SELECT 1 FROM payment_sessions ps
	JOIN finance_cases fc ON fc.session_id = ps.id AND fc.resolved_at IS NULL AND (fc.kind IN ('` + string(CaseLatePayment) + `', '` + string(CaseGatewayMismatch) + `')
		OR fc.kind = '` + string(CaseDuplicatePayment) + `' AND EXISTS (SELECT 1 FROM unnest(fc.facts) f WHERE f LIKE '% (succeeded, %' OR f LIKE '% (authorized, %'))
	WHERE ps.order_id = $1)`

// errLinkExpired is the refusal of a genuine link (or of the page's retry the links allowed)
// whose time is up.
func errLinkExpired() error {
	return Errorf(EEXPIRED, "this payment link has expired; ask the shop for a new one")
}

// CheckoutRetry says whether the order's page may start, without a checkout link in hand (the
// order's page token only), a new payment of amount in currency: the "Try again" after a
// decline, the "Pay again" after a cancel. The page token never expires and is in every URL
// pitlane hands the customer (the gateway's return URL too), so the retry is held to the links
// that priced the order: nil while one made at this amount and currency has not expired
// (checkout_prices.valid_until, the latest expiry among them); EEXPIRED once they all have (the
// answer the expired link itself gets); ErrLinkReplaced when the order's price is another. An
// order no link was ever made for (the shop paid it over the API) has no such time and gets
// ErrNoCheckoutRetry: the shop decides whether to try again (another Create, or a link), and the
// contract promises the customer no retry of its own; a page retry would otherwise work
// forever. The Pay click checks this before its claim, as it checks a link's expiry.
func (s *Service) CheckoutRetry(ctx context.Context, orderID string, amount int64, currency string) error {
	var (
		priceAmount   int64
		priceCurrency string
		pricedAt      time.Time
		validUntil    *time.Time
	)
	err := s.db.QueryRow(ctx, `SELECT amount, currency, priced_at, valid_until FROM checkout_prices WHERE order_id = $1`, orderID).
		Scan(&priceAmount, &priceCurrency, &pricedAt, &validUntil)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNoCheckoutRetry
	case err != nil:
		return dbError("checkout retry", err, "")
	case priceAmount != amount || priceCurrency != currency:
		return ErrLinkReplaced
	}
	until := pricedAt.Add(MaxCheckoutLinkTTL) // a row from before migration 00560: the longest a link lived
	if validUntil != nil {
		until = *validUntil
	}
	if !until.After(s.cfg.Clock.Now()) {
		return errLinkExpired()
	}
	return nil
}

// CheckoutPrice is the order's checkout price: the newest link's amount and currency, and the
// generation of the price (ok false when no link was made for it).
type CheckoutPrice struct {
	Amount     int64
	Currency   string
	Generation int64
}

// Replaces reports whether the price has replaced a link made for amount in currency in
// generation gen (ErrLinkReplaced): another amount or currency, or the same one again after a
// price between (a newer generation). A link without a generation (NoLinkGeneration) is judged
// by its amount and currency alone, as before generations: replicas of the release before make
// such links and render such Pay forms for every link while a deploy rolls (a review: refused
// as generation 0, the shop's current link was "replaced" until its next one). The release after
// this one, once none of the release before can serve, judges it as generation 0.
func (p CheckoutPrice) Replaces(amount int64, currency string, gen int64) bool {
	return p.Amount != amount || p.Currency != currency || gen != NoLinkGeneration && p.Generation != gen
}

// CheckoutPrice reads the order's checkout price (ok false when no link was made for it).
func (s *Service) CheckoutPrice(ctx context.Context, orderID string) (p CheckoutPrice, ok bool, err error) {
	err = s.db.QueryRow(ctx, `SELECT amount, currency, generation FROM checkout_prices WHERE order_id = $1`, orderID).Scan(&p.Amount, &p.Currency, &p.Generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return CheckoutPrice{}, false, nil
	}
	if err != nil {
		return CheckoutPrice{}, false, dbError("checkout price", err, "")
	}
	return p, true, nil
}

// Lifetimes of checkout links (the API call's "expires_in" chooses within the bounds).
const (
	DefaultCheckoutLinkTTL = 7 * 24 * time.Hour
	MinCheckoutLinkTTL     = time.Minute
	MaxCheckoutLinkTTL     = 30 * 24 * time.Hour
)

const (
	checkoutLinkDomain    = "checkout-link/v2" // sig: every link
	checkoutLinkDomainGen = "checkout-link/v3" // gsig: with the link's generation
)

// unsetCodeSecret is NewService's stand-in when Config.CodeSecret is empty. It is public (it is
// in this source), so links are neither made nor accepted under it: a forgeable signature would
// be the 1-cent checkout again.
var unsetCodeSecret = []byte("pitlane-unset-secret")

// CheckoutLink is a signed checkout link for one order, amount and currency, valid until
// ExpiresAt (whole seconds).
type CheckoutLink struct {
	OrderID   string
	Amount    int64
	Currency  string
	ExpiresAt time.Time
	// Generation is the run of the order's checkout price the link was made in (signed by
	// GenSig): a price change moves it on, and the link pays nothing from then on
	// (ErrLinkReplaced).
	Generation int64
	Sig        string // hex HMAC-SHA256 of checkout-link/v2, see above
	GenSig     string // hex HMAC-SHA256 of checkout-link/v3, with Generation
}

// Path is the link relative to the server: /checkout/{order}?amount=…&currency=…&exp=…&gen=…&gsig=…&sig=….
func (l CheckoutLink) Path() string {
	q := url.Values{}
	q.Set("amount", strconv.FormatInt(l.Amount, 10))
	q.Set("currency", l.Currency)
	q.Set("exp", strconv.FormatInt(l.ExpiresAt.Unix(), 10))
	q.Set("gen", strconv.FormatInt(l.Generation, 10))
	q.Set("gsig", l.GenSig)
	q.Set("sig", l.Sig)
	// Encode sorts the keys: amount, currency, exp, gen, gsig, sig.
	return CheckoutPath(l.OrderID) + "?" + q.Encode()
}

// CheckoutPath is the path of an order's checkout page, its one segment escaped. "." and ".."
// are valid order ids, but as a path segment they are dot segments, which browsers and HTTP
// clients resolve away before sending (/checkout/.. becomes /). Percent-encoding the dots does
// not help in browsers: the WHATWG URL standard treats "%2e" and "%2e%2e" (either case, in any
// mix with ".") as dot segments too (new URL('/checkout/%2E%2E?amount=1', base) is
// base + '?amount=1'), as RFC 3986 does not. So these two ids are spelled with a leading '~':
// "~." and "~.." are no dot segments to anyone, '~' is left alone by browsers and proxies (an
// RFC 3986 unreserved character), and it is not in the order-id alphabet, so no valid order id
// is spelled that way. CheckoutPathOrderID reads it back.
func CheckoutPath(orderID string) string {
	seg := url.PathEscape(orderID)
	if seg == "." || seg == ".." {
		seg = dotSegmentEscape + seg
	}
	return "/checkout/" + seg
}

// dotSegmentEscape is CheckoutPath's prefix of an order id that is a dot segment.
const dotSegmentEscape = "~"

// CheckoutPathOrderID is the order id of a checkout page's path segment, decoded once
// (handlers.PathParam): CheckoutPath's segment read back. "~." and "~.." are "." and ".."; the
// %2E spelling of earlier releases decodes to the dots (clients that do not resolve it away,
// such as Go's and curl's, reached those orders with it). Anything else is the segment as it
// is, which the caller validates (ValidOrderID).
func CheckoutPathOrderID(seg string) string {
	if rest, ok := strings.CutPrefix(seg, dotSegmentEscape); ok && (rest == "." || rest == "..") {
		return rest
	}
	return seg
}

// CheckoutURL is the absolute link under Config.PublicBaseURL (the path alone when that is unset).
func (s *Service) CheckoutURL(l CheckoutLink) string {
	return s.cfg.PublicBaseURL + l.Path()
}

// CheckoutLink signs a link for the order's payment of amount in currency (validated like
// Create's input), valid for ttl from now (0: DefaultCheckoutLinkTTL; otherwise between
// MinCheckoutLinkTTL and MaxCheckoutLinkTTL, else EINVALID naming "expires_in"). An order that is
// already paid gets none (ECONFLICT); an order pitlane has not seen yet is the usual case. The
// link's amount and currency become the order's checkout price: a Pay click from the checkout
// page pays only that (ErrLinkReplaced otherwise), so a link made before the shop re-priced the
// order pays nothing.
func (s *Service) CheckoutLink(ctx context.Context, orderID string, amount int64, currency string, ttl time.Duration) (CheckoutLink, error) {
	if err := (CreateInput{OrderID: orderID, Amount: amount, Currency: currency}).Validate(); err != nil {
		return CheckoutLink{}, err
	}
	if ttl == 0 {
		ttl = DefaultCheckoutLinkTTL
	}
	if ttl < MinCheckoutLinkTTL || ttl > MaxCheckoutLinkTTL {
		return CheckoutLink{}, Invalid("expires_in", "expires_in must be between %d and %d seconds",
			int64(MinCheckoutLinkTTL/time.Second), int64(MaxCheckoutLinkTTL/time.Second))
	}
	key, err := s.checkoutLinkKey()
	if err != nil {
		return CheckoutLink{}, err
	}
	now := s.cfg.Clock.Now()
	exp := now.Add(ttl).Truncate(time.Second)
	var gen int64
	// Under the order's claim lock (Create's): the order's state read here is the one a Pay
	// click's claim will see, and the price set here is the one it checks (checkout_prices,
	// migration 00520). A link made while a claim runs waits for it (lock_timeout bounds that).
	err = s.inTx(ctx, "checkout link", func(tx pgx.Tx) error {
		var (
			status         string
			activeAmount   *int64
			activeCurrency *string
		)
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(LockCreateOrder), orderID); err != nil {
			return dbError("checkout link: lock", err, "")
		}
		err := tx.QueryRow(ctx, `SELECT o.status, a.amount, a.currency FROM orders o
			LEFT JOIN LATERAL (SELECT amount, currency FROM payment_sessions WHERE order_id = o.order_id AND `+activeStatusSQL+`) a ON true
			WHERE o.order_id = $1`, orderID).Scan(&status, &activeAmount, &activeCurrency)
		switch {
		case errors.Is(err, pgx.ErrNoRows): // no payment yet: the usual case
		case err != nil:
			return dbError("checkout link: read order", err, "")
		case status == OrderPaid:
			return Errorf(ECONFLICT, "order %s is already paid", orderID)
		case activeAmount != nil && (*activeAmount != amount || *activeCurrency != currency):
			// The page would show that payment, not this amount, and a Pay click for this amount
			// would be refused as Create refuses it: say so to the shop now, not to the customer.
			return Errorf(ECONFLICT, "order %s has an active payment of %d %s; a link for %d %s could not be paid while it runs (cancel it first, or link its amount)",
				orderID, *activeAmount, *activeCurrency, amount, currency)
		}
		// The order's checkout price from now on: earlier links for another amount or currency
		// pay nothing any more. Its validity (what the page's retry without a link is held to,
		// CheckoutRetry) is the latest expiry among the links at this price: a new link at the
		// same price extends it (never shortens: the earlier link still works), a new price
		// starts it over. A row without one (migration 00560) counts as priced_at + the longest
		// lifetime, as CheckoutRetry reads it. A new price is a new generation (the trigger of
		// migration 01040), which the link is signed with: the links of the runs before pay
		// nothing.
		err = tx.QueryRow(ctx, `INSERT INTO checkout_prices (order_id, amount, currency, priced_at, valid_until) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (order_id) DO UPDATE SET amount = EXCLUDED.amount, currency = EXCLUDED.currency, priced_at = EXCLUDED.priced_at,
				valid_until = CASE WHEN checkout_prices.amount = EXCLUDED.amount AND checkout_prices.currency = EXCLUDED.currency
					THEN greatest(coalesce(checkout_prices.valid_until, checkout_prices.priced_at + make_interval(secs => $6)), EXCLUDED.valid_until)
					ELSE EXCLUDED.valid_until END
			RETURNING generation`,
			orderID, amount, currency, now, exp, MaxCheckoutLinkTTL.Seconds()).Scan(&gen)
		if err != nil {
			return dbError("checkout link: set price", err, "")
		}
		return nil
	})
	if err != nil {
		return CheckoutLink{}, err
	}
	return CheckoutLink{OrderID: orderID, Amount: amount, Currency: currency, ExpiresAt: exp, Generation: gen,
		Sig:    hex.EncodeToString(checkoutLinkMAC(key, orderID, amount, currency, exp.Unix(), NoLinkGeneration)),
		GenSig: hex.EncodeToString(checkoutLinkMAC(key, orderID, amount, currency, exp.Unix(), gen))}, nil
}

// CheckoutLinkParams are the query parameters of a checkout link (Path), which a Pay form carries
// as its fields.
var CheckoutLinkParams = []string{"amount", "currency", "exp", "gen", "gsig", "sig"}

// CheckoutLinkGeneration reads a link's gen from its query (or a Pay form): NoLinkGeneration when
// it has none (a link made before generations), else a generation (0 or more, decimal as
// signed); an error for anything else.
func CheckoutLinkGeneration(q url.Values) (int64, error) {
	if !q.Has("gen") {
		return NoLinkGeneration, nil
	}
	gen, err := strconv.ParseInt(q.Get("gen"), 10, 64)
	if err == nil && gen < 0 {
		err = strconv.ErrRange
	}
	return gen, err
}

// NoLinkGeneration is VerifyCheckoutLink's gen for a link that carries none (made before
// generations, or cut off): CheckoutPrice.Replaces judges it by amount and currency alone.
const NoLinkGeneration int64 = -1

// VerifyCheckoutLink checks a link (order, amount, currency, exp in Unix seconds, the price
// generation — NoLinkGeneration for a link without one —, sig, gsig) now: nil when sig signs it
// and, with a generation, gsig signs it with that generation (compared in constant time), and it
// has not expired; EEXPIRED when it is a genuine link whose time is up; EINVALID for anything
// else (any malformed signature, a gsig without gen, and every link on a service without a
// secret). Whether the order's price has replaced it since is CheckoutPrice's.
func (s *Service) VerifyCheckoutLink(orderID string, amount int64, currency string, exp, gen int64, sig, gsig string) error {
	invalid := Invalid("sig", "this payment link is incomplete or was changed")
	key, err := s.checkoutLinkKey()
	if err != nil || (gen == NoLinkGeneration) != (gsig == "") {
		return invalid
	}
	// The current secret, then every fallback (SECRET_KEY_FALLBACKS): a link signed before a
	// rotation keeps working for its lifetime, and one signed by a replica already on the new
	// secret works on one that has it as a fallback.
	keys := [][]byte{key}
	for _, fb := range s.cfg.CodeSecretFallbacks {
		keys = append(keys, linkKeyUnder(fb))
	}
	if !signedBy(keys, sig, orderID, amount, currency, exp, NoLinkGeneration) ||
		gen != NoLinkGeneration && !signedBy(keys, gsig, orderID, amount, currency, exp, gen) {
		return invalid
	}
	if !time.Unix(exp, 0).After(s.cfg.Clock.Now()) {
		return errLinkExpired()
	}
	return nil
}

// signedBy reports whether hex signature sig is the link's signature (checkoutLinkMAC with gen)
// under one of keys, each compared in constant time.
func signedBy(keys [][]byte, sig, orderID string, amount int64, currency string, exp, gen int64) bool {
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return false
	}
	valid := false
	for _, k := range keys {
		valid = hmac.Equal(got, checkoutLinkMAC(k, orderID, amount, currency, exp, gen)) || valid
	}
	return valid
}

// checkoutLinkKey derives the link key from the service secret (domain separation from the
// cancel-code HMAC, which is keyed by the secret itself).
func (s *Service) checkoutLinkKey() ([]byte, error) {
	if bytes.Equal(s.cfg.CodeSecret, unsetCodeSecret) {
		return nil, &Error{Code: EUNAVAIL, Message: "checkout links need a secret (SECRET_KEY) on this replica"}
	}
	return linkKeyUnder(s.cfg.CodeSecret), nil
}

func linkKeyUnder(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("pitlane checkout-link key v1"))
	return m.Sum(nil)
}

// checkoutLinkMAC is a link's signature: sig (checkout-link/v2) for gen NoLinkGeneration, gsig
// (checkout-link/v3, the same message and the generation) for a generation.
func checkoutLinkMAC(key []byte, orderID string, amount int64, currency string, exp, gen int64) []byte {
	m := hmac.New(sha256.New, key)
	if gen == NoLinkGeneration {
		m.Write([]byte(checkoutLinkDomain))
	} else {
		m.Write([]byte(checkoutLinkDomainGen))
	}
	m.Write([]byte{0})
	m.Write([]byte(orderID))
	m.Write([]byte{0})
	m.Write([]byte(strconv.FormatInt(amount, 10)))
	m.Write([]byte{0})
	m.Write([]byte(currency))
	m.Write([]byte{0})
	m.Write([]byte(strconv.FormatInt(exp, 10)))
	if gen != NoLinkGeneration {
		m.Write([]byte{0})
		m.Write([]byte(strconv.FormatInt(gen, 10)))
	}
	return m.Sum(nil)
}

// The order's page token: who may see an order's checkout page without a checkout link.
//
// The page shows whether the order is paid, its amount, and offers a retry of its last payment.
// Order ids are the shop's and often guessable (order-1001), so the page opens only for a
// genuine checkout link of the order (expired ones too: the customer had it) or with its page
// token, ?view=…: HMAC(link key, "order-page/v1" 0 order_id), 128 bits in hex. Every URL of the
// page pitlane hands out carries it: the gateway's return URL, the page's own updates, the way
// back from an error, a Pay click's follow-up page. Without either, the page answers as for an
// order that does not exist. The token does not expire: it shows one order's state to whoever
// the customer shares their return URL with, as the link does. What it may start does expire:
// its retry of the last payment is held to the links that priced the order (CheckoutRetry).
const (
	orderPageDomain = "order-page/v1"
	// OrderPageParam is the query parameter (and the Pay form's field) of the page token.
	OrderPageParam = "view"
)

// OrderPageToken is the order's page token ("" on a service without a secret: no page opens
// without a link there).
func (s *Service) OrderPageToken(orderID string) string {
	key, err := s.checkoutLinkKey()
	if err != nil {
		return ""
	}
	return hex.EncodeToString(orderPageMAC(key, orderID))
}

// VerifyOrderPageToken reports whether token is the order's page token, under the current secret
// or a fallback (a return URL made before a rotation keeps working). Constant-time.
func (s *Service) VerifyOrderPageToken(orderID, token string) bool {
	key, err := s.checkoutLinkKey()
	if err != nil || len(token) != 32 {
		return false
	}
	got, err := hex.DecodeString(token)
	if err != nil {
		return false
	}
	valid := hmac.Equal(got, orderPageMAC(key, orderID))
	for _, fb := range s.cfg.CodeSecretFallbacks {
		valid = hmac.Equal(got, orderPageMAC(linkKeyUnder(fb), orderID)) || valid
	}
	return valid
}

// OrderPagePath is the order's checkout page with its page token and q's parameters (q may be nil).
func (s *Service) OrderPagePath(orderID string, q url.Values) string {
	return s.withPageToken(CheckoutPath(orderID), orderID, q)
}

// withPageToken adds the order's page token (none on a service without a secret) and q to the
// query of u, a URL of the order's page.
func (s *Service) withPageToken(u, orderID string, q url.Values) string {
	v := url.Values{}
	for k, vs := range q {
		v[k] = vs
	}
	if tok := s.OrderPageToken(orderID); tok != "" {
		v.Set(OrderPageParam, tok)
	}
	if len(v) == 0 {
		return u
	}
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + v.Encode()
}

func orderPageMAC(key []byte, orderID string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(orderPageDomain))
	m.Write([]byte{0})
	m.Write([]byte(orderID))
	return m.Sum(nil)[:16]
}

// returnURL is where the gateway sends the customer back: Config.ReturnURL's page of the order,
// with the order's page token (the page opens for nobody else without a link).
func (s *Service) returnURL(sess Session) string {
	u := s.cfg.ReturnURL(sess)
	if u == "" {
		return u
	}
	return s.withPageToken(u, sess.OrderID, nil)
}
