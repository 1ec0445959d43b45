package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/alexedwards/scs/v2"
)

// hashedStore keeps sessions under the SHA-256 of their token, not the token itself: the cookie
// is a bearer credential (a signed-in admin's, say), and a database copy — a backup, a replica,
// a dump, a reporting role — must not hold credentials one could replay. The same reason as
// for API keys (SHA-256), passwords (bcrypt) and one-time codes (keyed hashes). Tokens are 32
// random bytes, so a plain hash is enough: nothing to guess them from.
//
// Deploying this ends the sessions stored before it (their rows are under the clear token, which
// the new replicas no longer look up): everyone signs in once more. Those rows are not deleted
// by a migration (migrations only expand: a replica of the release before still serves them
// during a rolling deploy); they expire within the session lifetime (12 h) and are reaped.
type hashedStore struct{ next scs.Store }

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func (s hashedStore) Find(token string) ([]byte, bool, error) { return s.next.Find(hashToken(token)) }

func (s hashedStore) Commit(token string, b []byte, expiry time.Time) error {
	return s.next.Commit(hashToken(token), b, expiry)
}

func (s hashedStore) Delete(token string) error { return s.next.Delete(hashToken(token)) }
