package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/alexedwards/scs/v2"
)

// hashedStore keeps sessions under the SHA-256 of their token, not the token itself: the cookie
// is a bearer credential (a signed-in admin's, say), and a database copy — a backup, a replica,
// a dump, a reporting role — must not hold credentials one could replay. The same reason as
// for API keys (SHA-256), passwords (bcrypt) and one-time codes (keyed hashes). Tokens are 32
// random bytes, so a plain hash is enough: nothing to guess them from.
//
// A rolling deploy: a replica of the release before keeps its sessions under the clear token.
// Until that release is gone everywhere, Find falls back on the clear token when the hash finds
// nothing, so staff signed in on an old replica stay signed in on a new one (a Commit then
// stores the session under its hash; Delete removes both). Sessions signed in on a new replica
// are not found by an old one: during the roll, sign-ins made on new replicas hold only there.
// The fallback goes in the next release (a contract step: docs/operations.md); the rows under a
// clear token expire within the session lifetime (12 h) and are reaped.
type hashedStore struct{ next scs.Store }

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func (s hashedStore) Find(token string) ([]byte, bool, error) {
	b, found, err := s.next.Find(hashToken(token))
	if err != nil || found || len(token) == len(hashToken("")) {
		// Never the fallback for a token shaped like a hash: the stored hashes, read from a
		// database copy, would work as cookies again. scs's tokens are 43 characters.
		return b, found, err
	}
	return s.next.Find(token) // a session of the release before (see above)
}

func (s hashedStore) Commit(token string, b []byte, expiry time.Time) error {
	return s.next.Commit(hashToken(token), b, expiry)
}

func (s hashedStore) Delete(token string) error {
	return errors.Join(s.next.Delete(hashToken(token)), s.next.Delete(token))
}
