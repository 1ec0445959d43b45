package payments

import (
	"testing"
	"time"
)

// A lock's wait in words says what Retry-After says, never less than is left (audit 5, F3: a
// lock with 15 s left said "locked for 1m0s", and 89 s left rounded down to "1m0s").
func TestCodeWaitInWords(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                 "0s",
		3 * time.Second:                   "3s",
		15*time.Second - time.Millisecond: "15s",
		time.Minute:                       "1m",
		59*time.Second + time.Millisecond: "1m",
		89 * time.Second:                  "2m",
		58 * time.Minute:                  "58m",
		24*time.Hour - time.Second:        "24h0m",
		23*time.Hour + 59*time.Minute:     "23h59m",
	} {
		if got := RoundUpWait(d); got != want {
			t.Errorf("RoundUpWait(%s) = %q, want %q", d, got, want)
		}
	}
}
