package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments"
)

// Device cookies (OWASP, "Slow down online guessing attacks with device cookies"). The sign-in
// throttle's address and global buckets stop a botnet, but a botnet (or one IPv6 /56, 256 of
// the /64s the address bucket counts) can also fill them and so refuse every sign-in in the
// world, and five guesses lock an account for its owner too. A browser that signed in to an
// account gets a device token (RememberDevice; the web layer keeps it in a long-lived cookie);
// its later attempts at that account, with that token, are trusted: they skip the address and
// global buckets and the account's lock. Only the token's SHA-256 is stored; a token of another
// account, unknown or spent, is an untrusted attempt like any other.
//
// A device's trust is an allowance of AccountFailures attempts, counted like the throttle's
// buckets: each trusted attempt takes one unit BEFORE its password is looked at (claimDevice,
// one guarded UPDATE, in the throttle's transaction), and a right password gives the device its
// whole allowance back. So a device's wrong passwords, sent one after the other or all at once,
// get past the throttle AccountFailures times in a row at most; the next attempts find the
// allowance spent and meet the buckets and the lock like anyone's. (Trust read first and a
// failure counted after bcrypt, as before, let a burst sent before the first failure was
// recorded through whole: 30 parallel guesses, 30 judged.)
//
// A device is as good as the password it was earned with and the sessions it came with: a new
// password (set by an admin or changed by its user), "sign out everywhere else" and disabling
// the user delete all of the user's devices (forgetDevices, in that change's transaction). The
// browser at hand gets a new token at its next sign-in.

// DeviceTTL is how long an unused device token stays trusted.
const DeviceTTL = 90 * 24 * time.Hour

func deviceHash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// claimDevice takes one unit of the allowance of a device token of email still trusted, and
// reports whether it had one: then the attempt is trusted. The WHERE refuses a spent, stale or
// other account's device, and concurrent claims on one device wait for each other's row lock
// and re-check it (READ COMMITTED), so no more than the allowance is ever handed out. The unit
// stays taken whatever happens next (a wrong password, an error): a right password gives it
// back (deviceSignedIn). It runs in the throttle's transaction, first: the device's row is the
// first lock of the order (device, address, global, account), and a trusted attempt takes no other.
func (s *Service) claimDevice(ctx context.Context, tx pgx.Tx, token, email string, now time.Time) (bool, error) {
	if len(token) != 64 {
		return false, nil
	}
	var failures int
	err := tx.QueryRow(ctx, `UPDATE staff_devices SET failures = failures + 1
		WHERE token_hash = $1 AND email = $2 AND failures < $3 AND last_used_at > $4 RETURNING failures`,
		deviceHash(token), email, s.Limits.AccountFailures, now.Add(-DeviceTTL)).Scan(&failures)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, payments.DBError("sign in: device", err, "")
	}
	return true, nil
}

// deviceSignedIn gives a trusted device whose attempt had the right password its allowance back:
// its failures are no longer a run.
func deviceSignedIn(ctx context.Context, tx pgx.Tx, token string) error {
	if _, err := tx.Exec(ctx, `UPDATE staff_devices SET failures = 0 WHERE token_hash = $1`, deviceHash(token)); err != nil {
		return payments.DBError("sign in: device", err, "")
	}
	return nil
}

// forgetDevices deletes every device token of email: the user's password changed, their
// sessions ended everywhere, or they were disabled (changeUser, in the change's transaction).
func forgetDevices(ctx context.Context, tx pgx.Tx, email string) error {
	_, err := tx.Exec(ctx, `DELETE FROM staff_devices WHERE email = $1`, email)
	return err
}

// RememberDevice returns the device token of a browser that just signed in as u: the one it
// sent when that is still trusted for u's email (its failures cleared), else a new one — or ""
// when u's account changed since the sign-in read it (a new password, its sessions ended,
// disabled: another session epoch). A device is as good as the password it was earned with:
// a sign-in with the old password that read the account before a password change committed
// must not leave a device behind the change's forgetDevices. Both statements hold u's row
// (FOR SHARE: a change in progress is waited for, then seen) and write only while it still has
// the epoch the sign-in read.
func (s *Service) RememberDevice(ctx context.Context, u User, sent string) (string, error) {
	now := s.clock.Now()
	if len(sent) == 64 {
		tag, err := s.db.Exec(ctx, `UPDATE staff_devices SET failures = 0, last_used_at = $3
			WHERE token_hash = $1 AND email = $2 AND failures < $4 AND last_used_at > $5
			  AND EXISTS (SELECT 1 FROM staff_users WHERE email = $2 AND session_epoch = $6 AND disabled_at IS NULL FOR SHARE)`,
			deviceHash(sent), u.Email, now, s.Limits.AccountFailures, now.Add(-DeviceTTL), u.SessionEpoch)
		if err != nil {
			return "", fmt.Errorf("remember device: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return sent, nil
		}
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	tag, err := s.db.Exec(ctx, `INSERT INTO staff_devices (token_hash, email, created_at, last_used_at)
		SELECT $1, email, $3, $3 FROM staff_users WHERE email = $2 AND session_epoch = $4 AND disabled_at IS NULL FOR SHARE`,
		deviceHash(token), u.Email, now, u.SessionEpoch)
	if err != nil {
		return "", fmt.Errorf("remember device: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return "", nil // the account changed since the sign-in: no device
	}
	return token, nil
}
