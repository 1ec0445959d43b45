// Package webhooksig signs and verifies the reference gateway's webhook signatures
// (gateway-api.md, "Webhooks"):
//
//	Gateway-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
//
// The simulator signs with it and refgw's WebhookVerifier (pitlane's receiving adapter) verifies
// with it, so both sides of the contract share one definition of the scheme. It stays a package
// of its own, depending on nothing of pitlane, so the simulator, a stand-in for any gateway, need
// not import pitlane's client to sign. The signature covers the raw body bytes: a receiver must
// verify before decoding, never over a re-encoded body.
package webhooksig

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Header is the HTTP header that carries the signature.
const Header = "Gateway-Signature"

// DefaultTolerance is how old a signature may be before a receiver refuses it (the contract's 300 s).
const DefaultTolerance = 300 * time.Second

// Errors Verify returns (wrapped with detail); test with errors.Is.
var (
	ErrMalformed = errors.New("webhooksig: malformed signature header")
	ErrNoMatch   = errors.New("webhooksig: no signature matches")
	ErrTooOld    = errors.New("webhooksig: timestamp outside tolerance")
	ErrNoSecret  = errors.New("webhooksig: no secret to verify with")
)

// Sign returns the header value for body signed with secret at time t.
func Sign(secret []byte, t time.Time, body []byte) string {
	return SignAll([][]byte{secret}, t, body)
}

// SignAll returns one header value with a v1 entry per secret, which is what a sender does
// while a secret is being rotated: receivers that know either secret accept the event.
func SignAll(secrets [][]byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	var b strings.Builder
	b.WriteString("t=")
	b.WriteString(ts)
	for _, s := range secrets {
		b.WriteString(",v1=")
		b.WriteString(hex.EncodeToString(mac(s, ts, body)))
	}
	return b.String()
}

func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks header against body. Any v1 entry matching any of secrets is enough (rotation:
// the receiver holds the old and the new secret, the sender may send one or both). The
// timestamp must be within tolerance of now in either direction: an old one is a possible
// replay, one far in the future is a clock problem we refuse to guess about. A tolerance of
// zero or less means DefaultTolerance. Comparison is constant-time (hmac.Equal) and every
// entry is compared, so timing says nothing about which entry or byte differed.
//
// Unknown schemes (v0=, v2=…) are ignored, as Stripe does, so a sender can add a scheme
// without breaking receivers; a header with no v1 entry at all is malformed.
func Verify(header string, body []byte, secrets [][]byte, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	var usable [][]byte
	for _, s := range secrets {
		if len(s) > 0 {
			usable = append(usable, s)
		}
	}
	if len(usable) == 0 {
		return ErrNoSecret
	}

	var (
		ts     string
		tsSeen bool
		sigs   [][]byte
		badV1  int // v1 entries that are not a hex SHA-256: they can match nothing
	)
	for _, part := range strings.Split(header, ",") {
		if strings.TrimSpace(part) == "" {
			continue // a trailing or doubled comma
		}
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue // not ours to read ("any match is enough": it voids no v1 beside it)
		}
		switch k {
		case "t":
			if tsSeen {
				return fmt.Errorf("%w: two timestamps", ErrMalformed)
			}
			ts, tsSeen = v, true
		case "v1":
			// "Any match is enough": an entry that cannot be a signature does not void one
			// beside it that is (a sender mid-rotation, a proxy's leftover).
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				badV1++
				continue
			}
			sigs = append(sigs, sig)
		}
	}
	if !tsSeen {
		return fmt.Errorf("%w: no timestamp", ErrMalformed)
	}
	if len(sigs) == 0 {
		if badV1 > 0 {
			return fmt.Errorf("%w: v1 is not a hex SHA-256", ErrMalformed)
		}
		return fmt.Errorf("%w: no v1 signature", ErrMalformed)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sec < 0 {
		return fmt.Errorf("%w: timestamp %q", ErrMalformed, ts)
	}

	// Check the signature before the age: an attacker learns nothing about our tolerance from
	// unsigned garbage, and a signed but stale event is reported as stale.
	matched := false
	for _, s := range usable {
		want := mac(s, ts, body)
		for _, sig := range sigs {
			if hmac.Equal(want, sig) {
				matched = true
			}
		}
	}
	if !matched {
		return ErrNoMatch
	}
	// In whole seconds, as the timestamp is: signed 300 s ago is within a 300-s tolerance
	// whatever fraction of a second has passed since (now's fraction made it 300.4 s, refused).
	// Compared in seconds, never as a Duration: a timestamp centuries away would overflow one
	// and wrap into the tolerance.
	age, tol := now.Unix()-sec, int64(tolerance/time.Second)
	if age > tol || age < -tol {
		return fmt.Errorf("%w: signed %d s ago, tolerance %s", ErrTooOld, age, tolerance)
	}
	return nil
}
