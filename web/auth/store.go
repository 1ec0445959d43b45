package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
// nothing, so staff signed in on an old replica stay signed in on a new one (a save updates it
// under its clear token, where either release's sign-out deletes it; Delete removes both). Sessions signed in on a new replica
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
// updated where it is (under its clear token for one of the release before); gone (ended
// meanwhile), it stays gone: errSessionEnded. A renewed one
// is stored through its renewal's link, unless that was ended meanwhile: errSessionEnded.
func (s hashedStore) CommitCtx(ctx context.Context, token string, b []byte, expiry time.Time) error {
	if from, _ := ctx.Value(renewedFromKey{}).(string); from != "" {
		// A renewed session is stored only through its link, and only while it is not ended
		// (a sign-out of the old token meanwhile: DeleteCtx).
		var stored bool
		if err := s.db.QueryRow(ctx, `WITH link AS (UPDATE session_renewals SET new_token = $1
				WHERE old_token = $4 AND NOT ended AND (new_token IS NULL OR new_token = $1) RETURNING 1),
			ins AS (INSERT INTO sessions (token, data, expiry) SELECT $1, $2, $3 FROM link
				ON CONFLICT (token) DO UPDATE SET data = EXCLUDED.data, expiry = EXCLUDED.expiry RETURNING 1)
			SELECT EXISTS (SELECT 1 FROM ins)`, hashToken(token), b, expiry, from).Scan(&stored); err != nil {
			return err
		}
		if !stored {
			return errSessionEnded
		}
		return nil
	}
	if only, _ := ctx.Value(existingOnlyKey{}).(bool); !only {
		return s.commit(ctx, token, b, expiry)
	}
	// Where it is: under its hash, or (the release before) under its clear token — never copied
	// from the clear row to a hashed one. A copy outlived a sign-out on an old replica (whose
	// delete knows the clear token only): a copy of the cookie kept opening the console on the
	// new replicas (an outside review, replicas).
	tag, err := s.db.Exec(ctx, `UPDATE sessions SET data = $2, expiry = $3 WHERE token = $1 OR (token = $4 AND $5)`,
		hashToken(token), b, expiry, token, len(token) != len(hashToken("")))
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errSessionEnded
	}
	return nil
}

// renewSignedInKey marks the context of a signed-in session's renewal (Manager.Restart,
// Manager.SignInAgain): the old token's delete must find it.
type renewSignedInKey struct{}

// renewedFromKey marks the context of a renewed session's commit with the hash of the token it
// was renewed from (Manager.signIn): the commit goes through the renewal's link.
type renewedFromKey struct{}

// DeleteCtx is what scs calls (RenewToken, Destroy).
//
// For a signed-in session's renewal, the session must still be there: one signed out while the
// request ran (a "sign out everywhere else" waiting on the user's row while the user signed out
// in another tab) was renewed onto a new token and signed the browser in again (an outside
// review): errSessionEnded instead. The delete leaves the renewal's link (session_renewals, in
// the same statement), which its commit fills in with the new token (CommitCtx).
//
// Any other delete (a sign-out, a sign-in over an old session) also ends what the token was
// renewed into. A sign-out that loaded its session just before a renewal in another tab deleted
// it found nothing to delete, and the renewal then stored the new token: signed out, the
// browser was signed in again by whichever answer came last. Now it ends the link: a renewal not
// yet stored stores nothing (errSessionEnded), one already stored is deleted.
func (s hashedStore) DeleteCtx(ctx context.Context, token string) error {
	if only, _ := ctx.Value(renewSignedInKey{}).(bool); only {
		var n int
		if err := s.db.QueryRow(ctx, `WITH d AS (DELETE FROM sessions WHERE token = $1 OR token = $2 RETURNING 1),
			l AS (INSERT INTO session_renewals (old_token, expiry) SELECT $1, now() + interval '1 hour'
				WHERE EXISTS (SELECT 1 FROM d) ON CONFLICT (old_token) DO NOTHING)
			SELECT count(*) FROM d`, hashToken(token), token).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errSessionEnded
		}
		return nil
	}
	if _, err := s.delete(ctx, token); err != nil {
		return err
	}
	return s.endRenewals(ctx, hashToken(token))
}

// endRenewals ends the renewals of the session stored under key: each link is marked ended and
// the session it leads to deleted, down the chain (a session renewed again). The delete is a
// statement of its own, after the mark: it must see the session a renewal committing meanwhile
// stored (the mark waited for its link's row, and returns its new token), which a snapshot
// taken before that commit would not.
func (s hashedStore) endRenewals(ctx context.Context, key string) error {
	for range 16 { // a chain longer than any a user makes in the link's hour
		var next *string
		err := s.db.QueryRow(ctx, `UPDATE session_renewals SET ended = true WHERE old_token = $1 RETURNING new_token`, key).Scan(&next)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && next == nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("end renewals: %w", err)
		}
		if _, err := s.db.Exec(ctx, `DELETE FROM sessions WHERE token = $1`, *next); err != nil {
			return fmt.Errorf("end renewals: %w", err)
		}
		key = *next
	}
	return nil
}
