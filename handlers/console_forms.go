package handlers

import (
	"strconv"
	"strings"

	"pitlane/payments"
)

// Form decoding of the console and the checkout, in one place.

// parseMajorAmount reads an amount typed by a person in major units ("19.99", "19,99", "20")
// into minor units of the currency (1999), refusing more decimals than the currency has.
func parseMajorAmount(s, currency string) (int64, error) {
	bad := payments.Invalid("amount", "amount must be a number like 19.99")
	s = strings.TrimSpace(strings.ReplaceAll(s, ",", "."))
	if s == "" {
		return 0, bad
	}
	digits := payments.MinorUnitDigits(currency)
	whole, frac, hasFrac := strings.Cut(s, ".")
	if whole == "" || (hasFrac && frac == "") || len(frac) > digits || strings.ContainsAny(whole+frac, "+-") {
		if len(frac) > digits {
			return 0, payments.Invalid("amount", "%s amounts have at most %d decimals", currency, digits)
		}
		return 0, bad
	}
	frac += strings.Repeat("0", digits-len(frac))
	if len(whole) > 13 {
		return 0, payments.Invalid("amount", "amount is too large")
	}
	n, err := strconv.ParseInt(whole+frac, 10, 64)
	if err != nil {
		return 0, bad
	}
	return n, nil
}

// parseMinorAmount reads an amount in minor units (checkout links and forms: ?amount=1999).
func parseMinorAmount(s string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n >= payments.MaxAmount {
		return 0, false
	}
	return n, true
}

// newPaymentForm is the console's "start a payment" form.
type newPaymentForm struct {
	OrderID, Amount, Currency, Contact string
}

func (f newPaymentForm) input() (payments.CreateInput, error) {
	cur := strings.ToUpper(strings.TrimSpace(f.Currency))
	in := payments.CreateInput{OrderID: strings.TrimSpace(f.OrderID), Currency: cur, CustomerContact: strings.TrimSpace(f.Contact)}
	if err := (payments.CreateInput{OrderID: in.OrderID, Amount: 1, Currency: cur}).Validate(); err != nil {
		return in, err
	}
	amount, err := parseMajorAmount(f.Amount, cur)
	if err != nil {
		return in, err
	}
	in.Amount = amount
	return in, in.Validate()
}
