package access_test

import (
	"context"
	"maps"
	"strings"
	"testing"

	"pitlane/payments"
)

// A sign-in email longer than 254 bytes is cut at 254 (SignIn). Cut in the middle of a
// multi-byte character it was no longer UTF-8: PostgreSQL refused it in the throttle's first
// statement, and every such attempt was an internal error (its text shown on the login page)
// that counted nothing, however many came. docs/console.md promises such input is "one more
// unknown email — refused, timed and throttled like any other". Here 25 attempts with it from
// one address meet the same refusals as 25 with a short unknown email from another. Outside
// review (codes and access); fails without the cut on a character.
func TestALongEmailCutInTheMiddleOfACharacterIsThrottledLikeAnyOther(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	outcomes := func(email, address string) map[string]int {
		codes := map[string]int{}
		for range 25 {
			_, err := b.acc.SignIn(ctx, attempt(email, "guess guess guess", address))
			codes[payments.ErrorCode(err)]++
			if c := payments.ErrorCode(err); c != payments.EWRONG && c != payments.ELOCKED {
				t.Errorf("sign in as %.20q…: %v", email, err)
			}
		}
		return codes
	}
	long := outcomes("a@"+strings.Repeat("b", 251)+"é.example.com", "198.51.100.7") // byte 254 is the middle of é
	short := outcomes("nobody@example.com", "198.51.100.8")
	if !maps.Equal(long, short) {
		t.Fatalf("outcomes of the long email %v, of a short unknown one %v: want the same", long, short)
	}
}
