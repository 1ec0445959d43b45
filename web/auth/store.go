package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/alexedwards/scs/v2"
	"github.com/jackc/pgx/v5/pgxpool"
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
//
// A session that existed when the request loaded it is only ever updated, never created again
// (CommitCtx under existingOnly): a request still running when the user signed out (in another
// tab, or a stolen copy of the cookie signed out by its owner) would otherwise insert the
// signed-out token back with the email in it when it saved its flash or its last-seen time,
// and set its cookie again (an outside review).
type hashedStore struct {
	next scs.Store
	db   *pgxpool.Pool
}

// existingOnlyKey marks a commit's context: the session was loaded from the store by this
// request under the token it commits (Manager.save).
type existingOnlyKey struct{}

// errSessionEnded: the session the request loaded was ended (signed out, renewed) meanwhile.
var errSessionEnded = errors.New("the session ended while the request ran")

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

// CommitCtx is what scs calls (with the request's context). A session the request loaded is
// updated where it is; gone (ended meanwhile), it stays gone: errSessionEnded. One found under
// its clear token (the release before) is stored under its hash as Commit does.
func (s hashedStore) CommitCtx(ctx context.Context, token string, b []byte, expiry time.Time) error {
	if only, _ := ctx.Value(existingOnlyKey{}).(bool); !only || s.db == nil {
		return s.Commit(token, b, expiry)
	}
	var updated, clear bool
	if err := s.db.QueryRow(ctx, `WITH u AS (UPDATE sessions SET data = $2, expiry = $3 WHERE token = $1 RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM u), EXISTS (SELECT 1 FROM sessions WHERE token = $4)`,
		hashToken(token), b, expiry, token).Scan(&updated, &clear); err != nil {
		return err
	}
	switch {
	case updated:
		return nil
	case clear && len(token) != len(hashToken("")):
		return s.Commit(token, b, expiry)
	}
	return errSessionEnded
}

// renewSignedInKey marks the context of a signed-in session's renewal (Manager.Restart,
// Manager.SignInAgain): the old token's delete must find it.
type renewSignedInKey struct{}

// DeleteCtx is what scs calls (RenewToken, Destroy). For a signed-in session's renewal, the
// session must still be there: one signed out while the request ran (a "sign out everywhere
// else" waiting on the user's row while the user signed out in another tab) was renewed onto a
// new token and signed the browser in again (an outside review): errSessionEnded instead.
func (s hashedStore) DeleteCtx(ctx context.Context, token string) error {
	if only, _ := ctx.Value(renewSignedInKey{}).(bool); !only || s.db == nil {
		return s.Delete(token)
	}
	tag, err := s.db.Exec(ctx, `DELETE FROM sessions WHERE token = $1 OR token = $2`, hashToken(token), token)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errSessionEnded
	}
	return nil
}

func (s hashedStore) Delete(token string) error {
	return errors.Join(s.next.Delete(hashToken(token)), s.next.Delete(token))
}
