package access_test

import (
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// Characters that show as nothing though Go calls them printable: a new account
// "root<X>@example.com" looked exactly like root@example.com in every list (a review).
// payments.ShownAsIs refuses Unicode's other default-ignorables; an address, variation selectors.
func TestEmailsWithCharactersThatShowAsNothingAreRefused(t *testing.T) {
	t.Parallel()
	for _, e := range []string{
		"ro\u034fot@example.com",     // COMBINING GRAPHEME JOINER (Mn, default ignorable)
		"root\u3164@example.com",     // HANGUL FILLER (Lo, renders blank)
		"root\u115f@example.com",     // HANGUL CHOSEONG FILLER
		"ro\ufe00ot@example.com",     // VARIATION SELECTOR-1 (Mn, nothing after an o)
		"ro\U000E0100ot@example.com", // VARIATION SELECTOR-17
		"ro\u17b4ot@example.com",     // KHMER VOWEL INHERENT AQ (Mn, default ignorable)
	} {
		if err := access.ValidateEmail(access.NormalizeEmail(e)); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("email %+q: %v, want refused (looks like root@example.com)", e, err)
		}
	}
}

// An account stored before ValidateEmail refused a line separator or a private-use character is
// still named by the command line (CheckAddress: it can be disabled, its role changed).
func TestAnOldAccountWhoseAddressIsNowRefusedIsStillNamed(t *testing.T) {
	t.Parallel()
	for _, e := range []string{"root\u2028x@example.com", "root\ue000@example.com"} {
		n := access.NormalizeEmail(e)
		if err := access.ValidateEmail(n); err == nil {
			t.Errorf("%+q: ValidateEmail took it", e)
		}
		if err := access.CheckAddress(n); err != nil {
			t.Errorf("%+q: CheckAddress refused an existing account's address: %v", e, err)
		}
	}
}
