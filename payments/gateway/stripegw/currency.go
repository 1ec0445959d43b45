package stripegw

import (
	"fmt"

	"pitlane/payments"
)

// Stripe's API counts some currencies in other units than ISO 4217, whose minor units the core
// keeps (payments.MinorUnitDigits): https://docs.stripe.com/currencies.
//
//   - Zero-decimal at Stripe: an amount is whole units. MGA has two decimals in ISO 4217, so the
//     core's 1050 (10.50 Ar) is Stripe's 10 and half an ariary cannot be charged.
//   - ISK and UGX have no decimals in ISO 4217 but two in Stripe's API (its special cases: "an
//     ISK amount of 100 will continue to represent 1 króna"; "to charge 5 UGX, provide an amount
//     value of 500"), so the core's 5000 is Stripe's 500000. UGX sat among the zero-decimal
//     currencies (Stripe's own list has it there too) and was charged a hundredth of its price
//     while the answer echoed the amount sent (an outside review).
//   - Three-decimal (BHD, JOD, KWD, OMR, TND): the same units, but Stripe requires the last digit
//     to be 0.
//
// Passed through unchanged, an ISK payment was charged a hundredth of its price and an MGA one a
// hundred times it, and Stripe's answer echoed the same integer, so the amount check passed (an
// outside review).
var stripeZeroDecimal = map[string]bool{
	"BIF": true, "CLP": true, "DJF": true, "GNF": true, "JPY": true, "KMF": true, "KRW": true, "MGA": true,
	"PYG": true, "RWF": true, "VND": true, "VUV": true, "XAF": true, "XOF": true, "XPF": true,
}

var stripeThreeDecimal = map[string]bool{"BHD": true, "JOD": true, "KWD": true, "OMR": true, "TND": true}

// stripeDigits is how many decimals Stripe's API gives a currency (upper case).
func stripeDigits(currency string) int {
	switch {
	case stripeZeroDecimal[currency]:
		return 0
	case stripeThreeDecimal[currency]:
		return 3
	}
	return 2 // ISK and UGX included
}

func pow10(n int) int64 {
	f := int64(1)
	for range n {
		f *= 10
	}
	return f
}

// toStripe converts an amount in the core's minor units of currency (upper case) into Stripe's,
// or says why Stripe cannot be asked for it (a definitive refusal, sent nowhere).
func toStripe(op string, amount int64, currency string) (int64, error) {
	iso, st := payments.MinorUnitDigits(currency), stripeDigits(currency)
	out := amount
	switch {
	case st > iso:
		out = amount * pow10(st-iso)
	case st < iso:
		f := pow10(iso - st)
		if amount%f != 0 {
			return 0, invalid(op, fmt.Sprintf("Stripe charges %s in whole units only: %d minor units is not a whole amount", currency, amount))
		}
		out = amount / f
	}
	if stripeThreeDecimal[currency] && out%10 != 0 {
		return 0, invalid(op, fmt.Sprintf("Stripe requires %s amounts to end in 0 (%d does not)", currency, amount))
	}
	return out, nil
}

// fromStripe converts an amount Stripe reports in currency (upper case) into the core's minor
// units. One that is not a whole number of them (a fractional-króna charge from before Stripe
// refused those) is -1: it can equal no session's amount, so the core's amount check makes it a
// gateway_mismatch case, never a success.
func fromStripe(amount int64, currency string) int64 {
	iso, st := payments.MinorUnitDigits(currency), stripeDigits(currency)
	switch {
	case st > iso:
		f := pow10(st - iso)
		if amount%f != 0 {
			return -1
		}
		return amount / f
	case st < iso:
		return amount * pow10(iso-st)
	}
	return amount
}
