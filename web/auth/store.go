package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
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
//
// Every statement runs under the request's context (scs's ...Ctx calls): the table and its
// statements are pgxstore's, but pgxstore runs them under context.Background, so a session's
// load or save waited as long as a database that did not answer, past the request's bound.
type hashedStore struct {
	db *pgxpool.Pool
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

// FindCtx is what scs calls (with the request's context).
func (s hashedStore) FindCtx(ctx context.Context, token string) ([]byte, bool, error) {
	b, found, err := s.find(ctx, hashToken(token))
	if err != nil || found || len(token) == len(hashToken("")) {
		// Never the fallback for a token shaped like a hash: the stored hashes, read from a
		// database copy, would work as cookies again. scs's tokens are 43 characters.
		return b, found, err
	}
	return s.find(ctx, token) // a session of the release before (see above)
}

func (s hashedStore) find(ctx context.Context, key string) ([]byte, bool, error) {
	var b []byte
	err := s.db.QueryRow(ctx, `SELECT data FROM sessions WHERE token = $1 AND current_timestamp < expiry`, key).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return b, err == nil, err
}

// commit stores a session under the hash of its token.
func (s hashedStore) commit(ctx context.Context, token string, b []byte, expiry time.Time) error {
	_, err := s.db.Exec(ctx, `INSERT INTO sessions (token, data, expiry) VALUES ($1, $2, $3)
		ON CONFLICT (token) DO UPDATE SET data = EXCLUDED.data, expiry = EXCLUDED.expiry`, hashToken(token), b, expiry)
	return err
}

// delete removes a session, under its hash and (the release before) its clear token, and says
// how many rows it removed.
func (s hashedStore) delete(ctx context.Context, token string) (int64, error) {
	tag, err := s.db.Exec(ctx, `DELETE FROM sessions WHERE token = $1 OR token = $2`, hashToken(token), token)
	return tag.RowsAffected(), err
}

// Find, Commit and Delete are scs.Store's, for callers without a context (scs calls the
// ...Ctx forms).
func (s hashedStore) Find(token string) ([]byte, bool, error) {
	return s.FindCtx(context.Background(), token)
}

func (s hashedStore) Commit(token string, b []byte, expiry time.Time) error {
	return s.commit(context.Background(), token, b, expiry)
}

func (s hashedStore) Delete(token string) error { return s.DeleteCtx(context.Background(), token) }

// CommitCtx is what scs calls (with the request's context). A session the request loaded is
// updated where it is; gone (ended meanwhile), it stays gone: errSessionEnded. One found under
// its clear token (the release before) is stored under its hash as Commit does.
func (s hashedStore) CommitCtx(ctx context.Context, token string, b []byte, expiry time.Time) error {
	if only, _ := ctx.Value(existingOnlyKey{}).(bool); !only {
		return s.commit(ctx, token, b, expiry)
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
		return s.commit(ctx, token, b, expiry)
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
	n, err := s.delete(ctx, token)
	if err != nil {
		return err
	}
	if only, _ := ctx.Value(renewSignedInKey{}).(bool); only && n == 0 {
		return errSessionEnded
	}
	return nil
}
