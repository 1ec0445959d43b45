package handlers

import (
	"strconv"
	"strings"
	"time"

	"pitlane/payments"
	"pitlane/views"
)

// Form decoding of the console and the checkout, in one place.

// parseMajorAmount reads an amount typed by a person in major units ("19.99", "19,99", "20")
// into minor units of the currency (1999), refusing more decimals than the currency has.
//
// A comma is a decimal mark, except where it reads as a thousands separator just as well: in a
// currency of three decimals or more (KWD, BHD, CLF, …) "1,500" is 1.500 to some and 1500 to
// others, so it is refused as ambiguous rather than taken as either. (A point stays a decimal
// point in every currency.)
func parseMajorAmount(s, currency string) (int64, error) {
	bad := payments.Invalid("amount", "amount must be a number like 19.99")
	digits := payments.MinorUnitDigits(currency)
	if _, frac, ok := strings.Cut(strings.TrimSpace(s), ","); ok && digits >= 3 && len(frac) == 3 {
		return 0, payments.Invalid("amount", "%q could be read two ways: write %s amounts with a decimal point (1.500), or without a separator (1500)", strings.TrimSpace(s), currency)
	}
	s = strings.TrimSpace(strings.ReplaceAll(s, ",", "."))
	if s == "" {
		return 0, bad
	}
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
	switch {
	case err != nil:
		return 0, bad
	case n <= 0:
		return 0, payments.Invalid("amount", "the amount must be more than 0")
	case n >= payments.MaxAmount:
		// Told in the units typed: the core's own message speaks of minor units, and someone
		// who typed 19.99 and obeyed it would ask for a hundred times the money.
		return 0, payments.Invalid("amount", "the amount is too large: at most %s %s", payments.FormatMinor(payments.MaxAmount-1, currency), currency)
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

// refundForm is one of the payment page's refund forms (support's and finance's): the amount in
// major units of the payment's currency, a reason, the form's intent key, and seen, what its page
// showed of the payment's refunds (PaymentDetail.RefundsSeen; empty from a page rendered before
// forms carried it).
type refundForm struct {
	Amount, Reason, Intent, Seen string
}

func (f refundForm) input(sess payments.Session) (payments.StaffRefundInput, error) {
	in := payments.StaffRefundInput{PaymentID: sess.ID, Reason: f.Reason, IntentKey: strings.TrimSpace(f.Intent)}
	if seen := strings.TrimSpace(f.Seen); seen != "" {
		r, err := payments.ParseRefundsSeen(seen)
		if err != nil {
			return in, err
		}
		in.Seen = &r
	}
	var err error
	in.Amount, err = parseMajorAmount(f.Amount, sess.Currency)
	return in, err
}

// stuckFilter reads the finance workbench's filter from the query string.
func stuckFilter(state, currency, flagged, age, sort, after string) (payments.StuckFilter, error) {
	f := payments.StuckFilter{Status: payments.Status(state), Currency: currency, Flagged: payments.FlagFilter(flagged),
		Sort: payments.StuckSort(sort), After: after}
	if age = strings.TrimSpace(age); age != "" {
		d, err := time.ParseDuration(age)
		if err != nil || d < 0 {
			return f, payments.Invalid("age", "age must be a duration like 24h")
		}
		f.MinAge = d
	}
	return f, nil
}

// ledgerFilter reads the ledger's filter: dates as YYYY-MM-DD in UTC, both days included.
func ledgerFilter(f views.LedgerFilterForm) (payments.LedgerFilter, error) {
	out := payments.LedgerFilter{Currency: f.Currency, Type: f.Type}
	day := func(field, s string) (time.Time, error) {
		if s = strings.TrimSpace(s); s == "" {
			return time.Time{}, nil
		}
		t, err := time.Parse(time.DateOnly, s)
		if err != nil || t.Year() < 1 {
			// Go reads year 0; PostgreSQL has no year 0 (1 BC) and refused it as a 500.
			return time.Time{}, payments.Invalid(field, "%s must be a date like 2026-11-30", field)
		}
		return t, nil
	}
	var err error
	if out.From, err = day("from", f.From); err != nil {
		return out, err
	}
	if out.To, err = day("to", f.To); err != nil {
		return out, err
	}
	if !out.To.IsZero() {
		out.To = out.To.AddDate(0, 0, 1) // the last day included
	}
	return out.Validate()
}
