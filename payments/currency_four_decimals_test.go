package payments_test

import (
	"testing"

	"pitlane/payments"
)

// ISO 4217 gives two active currencies a minor unit of 1/10,000: CLF (Unidad de Fomento) and
// UYW (Unidad Previsional). The contract takes any three upper-case letters and amounts in
// minor units, and MinorUnitDigits claims to list every currency whose minor unit is not 1/100;
// these two fell through to 2, so the console showed, parsed and messaged their amounts 100x off
// (a 1.2345 CLF payment, 12345 minor units, read "123.45 CLF"). Outside review (money).
func TestFourDecimalCurrenciesAreReadAtTheirExponent(t *testing.T) {
	t.Parallel()
	for _, cur := range []string{"CLF", "UYW"} {
		if d := payments.MinorUnitDigits(cur); d != 4 {
			t.Errorf("MinorUnitDigits(%s) = %d, want 4 (ISO 4217)", cur, d)
		}
		if got := payments.FormatMinor(12345, cur); got != "1.2345" {
			t.Errorf("FormatMinor(12345, %s) = %q, want %q", cur, got, "1.2345")
		}
	}
}
