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

	"github.com/jackc/pgx/v5"
)

// Checkout links: what a shop sends its customer to pay an order's first payment,
//
//	/checkout/{order_id}?amount=1999&currency=EUR&sig=<64 hex>
//
// The checkout page offers Pay for the amount and currency of a link only when sig is
// HMAC-SHA256(link key, "checkout-link/v1" 0 order_id 0 amount 0 currency), so a customer who
// edits the URL (1 cent instead of 19.99) gets no Pay form. The link key is derived from the
// service secret (HMAC(secret, "pitlane checkout-link key v1")), so a link signature and a
// one-time code hash (codeHash) are never values of the same function, whatever their inputs.
// The message is unambiguous: order ids and currencies cannot hold a 0 byte and the amount is
// decimal. A link carries no expiry: it names an order and what it costs, like the shop's own
// order page; an order that is already paid offers no Pay form whatever the link says.
//
// Nothing is stored: any replica with the same secret verifies any link (SECRET_KEY must be the
// same on every replica, as for CSRF tokens and cancel codes).

const checkoutLinkDomain = "checkout-link/v1"

// unsetCodeSecret is NewService's stand-in when Config.CodeSecret is empty. It is public (it is
// in this source), so links are neither made nor accepted under it: a forgeable signature would
// be the 1-cent checkout again.
var unsetCodeSecret = []byte("pitlane-unset-secret")

// CheckoutLink is a signed checkout link for one order, amount and currency.
type CheckoutLink struct {
	OrderID  string
	Amount   int64
	Currency string
	Sig      string // hex HMAC-SHA256, see above
}

// Path is the link relative to the server: /checkout/{order}?amount=…&currency=…&sig=….
func (l CheckoutLink) Path() string {
	q := url.Values{}
	q.Set("amount", strconv.FormatInt(l.Amount, 10))
	q.Set("currency", l.Currency)
	q.Set("sig", l.Sig)
	// Encode sorts the keys: amount, currency, sig.
	return "/checkout/" + url.PathEscape(l.OrderID) + "?" + q.Encode()
}

// CheckoutURL is the absolute link under Config.PublicBaseURL (the path alone when that is unset).
func (s *Service) CheckoutURL(l CheckoutLink) string {
	return s.cfg.PublicBaseURL + l.Path()
}

// CheckoutLink signs a link for the order's payment of amount in currency (validated like
// Create's input). An order that is already paid gets none (ECONFLICT); an order pitlane has
// not seen yet is the usual case. It writes nothing.
func (s *Service) CheckoutLink(ctx context.Context, orderID string, amount int64, currency string) (CheckoutLink, error) {
	if err := (CreateInput{OrderID: orderID, Amount: amount, Currency: currency}).Validate(); err != nil {
		return CheckoutLink{}, err
	}
	key, err := s.checkoutLinkKey()
	if err != nil {
		return CheckoutLink{}, err
	}
	var status string
	err = s.db.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1`, orderID).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // no payment yet: the usual case
	case err != nil:
		return CheckoutLink{}, dbError("checkout link: read order", err, "")
	case status == OrderPaid:
		return CheckoutLink{}, Errorf(ECONFLICT, "order %s is already paid", orderID)
	}
	return CheckoutLink{OrderID: orderID, Amount: amount, Currency: currency,
		Sig: hex.EncodeToString(checkoutLinkMAC(key, orderID, amount, currency))}, nil
}

// VerifyCheckoutLink reports whether sig is the signature of the link (order, amount, currency),
// compared in constant time. Any malformed sig, and every sig on a service without a secret,
// is false.
func (s *Service) VerifyCheckoutLink(orderID string, amount int64, currency, sig string) bool {
	key, err := s.checkoutLinkKey()
	if err != nil || len(sig) != 2*sha256.Size {
		return false
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return false
	}
	return hmac.Equal(got, checkoutLinkMAC(key, orderID, amount, currency))
}

// checkoutLinkKey derives the link key from the service secret (domain separation from the
// cancel-code HMAC, which is keyed by the secret itself).
func (s *Service) checkoutLinkKey() ([]byte, error) {
	if bytes.Equal(s.cfg.CodeSecret, unsetCodeSecret) {
		return nil, &Error{Code: EUNAVAIL, Message: "checkout links need a secret (SECRET_KEY) on this replica"}
	}
	m := hmac.New(sha256.New, s.cfg.CodeSecret)
	m.Write([]byte("pitlane checkout-link key v1"))
	return m.Sum(nil), nil
}

func checkoutLinkMAC(key []byte, orderID string, amount int64, currency string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(checkoutLinkDomain))
	m.Write([]byte{0})
	m.Write([]byte(orderID))
	m.Write([]byte{0})
	m.Write([]byte(strconv.FormatInt(amount, 10)))
	m.Write([]byte{0})
	m.Write([]byte(currency))
	return m.Sum(nil)
}
