package webhooksig_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"pitlane/payments/gateway/webhooksig"
)

var (
	t0     = time.Unix(1764489600, 0)
	secret = []byte("whsec_current")
	old    = []byte("whsec_previous")
	body   = []byte(`{"id":"evt_1","type":"payment.updated","data":{"id":"gp_1","status":"succeeded"}}`)
)

func TestSignKnownAnswer(t *testing.T) {
	t.Parallel()
	// Computed independently of this package:
	//   printf '1764489600.%s' "$body" | openssl dgst -sha256 -hmac whsec_current
	const want = "t=1764489600,v1=e935caefa67674ba3d731f17d623a68a2af726ffaff9027998779a788e03e187"
	if got := webhooksig.Sign(secret, t0, body); got != want {
		t.Fatalf("Sign = %q\nwant   %q", got, want)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	valid := webhooksig.Sign(secret, t0, body)
	flipped := append([]byte(nil), body...)
	flipped[10] ^= 0x01

	tests := []struct {
		name    string
		header  string
		body    []byte
		secrets [][]byte
		now     time.Time
		want    error // nil = accepted
	}{
		{"valid", valid, body, [][]byte{secret}, t0, nil},
		{"valid 300 s later", valid, body, [][]byte{secret}, t0.Add(300 * time.Second), nil},
		{"301 s old", valid, body, [][]byte{secret}, t0.Add(301 * time.Second), webhooksig.ErrTooOld},
		{"301 s in the future", valid, body, [][]byte{secret}, t0.Add(-301 * time.Second), webhooksig.ErrTooOld},
		{"one flipped body byte", valid, flipped, [][]byte{secret}, t0, webhooksig.ErrNoMatch},
		{"wrong secret", valid, body, [][]byte{[]byte("whsec_other")}, t0, webhooksig.ErrNoMatch},
		{"bad signature", "t=1764489600,v1=" + strings.Repeat("ab", 32), body, [][]byte{secret}, t0, webhooksig.ErrNoMatch},
		{"timestamp changed", strings.Replace(valid, "t=1764489600", "t=1764489601", 1), body, [][]byte{secret}, t0, webhooksig.ErrNoMatch},
		{"rotation: receiver knows old and new, sender signs with new", valid, body, [][]byte{old, secret}, t0, nil},
		{"rotation: two v1, receiver knows only the old", webhooksig.SignAll([][]byte{secret, old}, t0, body), body, [][]byte{old}, t0, nil},
		{"rotation: two v1, receiver knows only the new", webhooksig.SignAll([][]byte{old, secret}, t0, body), body, [][]byte{secret}, t0, nil},
		{"rotation: two v1, none known", webhooksig.SignAll([][]byte{old, secret}, t0, body), body, [][]byte{[]byte("x")}, t0, webhooksig.ErrNoMatch},
		{"unknown scheme ignored", valid + ",v0=deadbeef", body, [][]byte{secret}, t0, nil},
		{"empty header", "", body, [][]byte{secret}, t0, webhooksig.ErrMalformed},
		{"no timestamp", "v1=" + strings.Repeat("ab", 32), body, [][]byte{secret}, t0, webhooksig.ErrMalformed},
		{"two timestamps", "t=1,t=2,v1=" + strings.Repeat("ab", 32), body, [][]byte{secret}, t0, webhooksig.ErrMalformed},
		{"no v1", "t=1764489600", body, [][]byte{secret}, t0, webhooksig.ErrMalformed},
		{"v1 not hex", "t=1764489600,v1=zz", body, [][]byte{secret}, t0, webhooksig.ErrMalformed},
		{"v1 too short", "t=1764489600,v1=abcd", body, [][]byte{secret}, t0, webhooksig.ErrMalformed},
		// "Any match is enough": an entry that cannot be a signature does not void a valid one.
		{"a non-hex v1 before a valid one", strings.Replace(valid, "v1=", "v1=zzzz,v1=", 1), body, [][]byte{secret}, t0, nil},
		{"a short v1 after a valid one", valid + ",v1=abcd", body, [][]byte{secret}, t0, nil},
		{"a trailing comma", valid + ",", body, [][]byte{secret}, t0, nil},
		{"a doubled comma", strings.Replace(valid, ",", ",,", 1), body, [][]byte{secret}, t0, nil},
		{"a non-hex v1 beside a wrong one", "t=1764489600,v1=zz,v1=" + strings.Repeat("ab", 32), body, [][]byte{secret}, t0, webhooksig.ErrNoMatch},
		{"timestamp not a number", "t=soon,v1=" + strings.Repeat("ab", 32), body, [][]byte{secret}, t0, webhooksig.ErrMalformed},
		{"entry without =", "t=1764489600,v1", body, [][]byte{secret}, t0, webhooksig.ErrMalformed},
		{"no secrets", valid, body, nil, t0, webhooksig.ErrNoSecret},
		{"empty secret does not verify an empty-key signature", webhooksig.Sign(nil, t0, body), body, [][]byte{{}}, t0, webhooksig.ErrNoSecret},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := webhooksig.Verify(tc.header, tc.body, tc.secrets, tc.now, webhooksig.DefaultTolerance)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Verify = %v, want accepted", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestVerifyDefaultTolerance(t *testing.T) {
	t.Parallel()
	h := webhooksig.Sign(secret, t0, body)
	if err := webhooksig.Verify(h, body, [][]byte{secret}, t0.Add(301*time.Second), 0); !errors.Is(err, webhooksig.ErrTooOld) {
		t.Fatalf("tolerance 0 should mean the default 300 s; got %v", err)
	}
	if err := webhooksig.Verify(h, body, [][]byte{secret}, t0.Add(time.Hour), 2*time.Hour); err != nil {
		t.Fatalf("explicit tolerance: %v", err)
	}
}
