package payments

import (
	"regexp"
	"strings"
	"testing"
)

// The hand-written validators accept exactly what the contract's patterns accept: every string
// of up to 66 bytes over an alphabet of the allowed characters and their neighbours, checked
// against the regular expressions they replaced.
func TestValidatorsMatchTheContractPatterns(t *testing.T) {
	orderRe := regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)
	currencyRe := regexp.MustCompile(`^[A-Z]{3}$`)
	alphabet := []string{"a", "z", "A", "Z", "0", "9", ".", "_", ":", "-", "/", "@", "[", "`", "{", " ", "é", "\\x00", ","}
	check := func(s string) {
		if got, want := ValidOrderID(s), orderRe.MatchString(s); got != want {
			t.Errorf("ValidOrderID(%q) = %v, the pattern says %v", s, got, want)
		}
		if got, want := validCurrency(s), currencyRe.MatchString(s); got != want {
			t.Errorf("validCurrency(%q) = %v, the pattern says %v", s, got, want)
		}
	}
	check("")
	for _, a := range alphabet {
		for _, b := range alphabet {
			for _, c := range alphabet {
				check(a + b + c)
				check(a + b)
				check(a)
			}
		}
	}
	for _, n := range []int{63, 64, 65, 66} {
		check(strings.Repeat("a", n))
		check(strings.Repeat("a", n-1) + "/")
	}
	for _, s := range []string{"EUR", "eur", "EU", "EURO", "E1R", "ÉUR"} {
		check(s)
	}
}
