package access

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments"
)

// Limits of the sign-in throttle (contract: "throttled per account and per client address").
// Three counters stand in front of every password check, all in PostgreSQL so every replica
// sees the same counts:
//
//   - per account: AccountFailures wrong passwords for one email, each within AccountWindow of
//     the one before, lock that email for AccountWindow. Unknown emails are counted the same
//     way, so a lockout tells nothing about which emails exist.
//   - per client address: a leaky bucket of AddressBurst attempts draining AddressBurst per
//     AddressWindow. One address can no longer walk through the staff list (or lock every
//     admin out with five guesses each): it runs dry after AddressBurst failures.
//   - global: a bucket of GlobalBurst attempts per GlobalWindow across all addresses, the
//     ceiling a botnet meets. It bounds the bcrypt work and the throttle rows an attack makes.
//
// An attempt takes its units before the password is looked at (a successful sign-in gives the
// address and global units back), so parallel guesses are counted one by one and a throttled
// attempt costs no bcrypt and writes nothing. A browser that signed in to the account before
// (its device token, devices.go) takes none of them: it takes a unit of its device's allowance
// instead, the same way (before the password is looked at), and meets all three once that is spent.
type Limits struct {
	AccountFailures int
	AccountWindow   time.Duration
	AddressBurst    int
	AddressWindow   time.Duration
	GlobalBurst     int
	GlobalWindow    time.Duration
}

// DefaultLimits: an office behind one address has room for its typos; an attacker gets twenty
// guesses per address per quarter hour and the whole world 300 a minute (about what bcrypt at
// cost 12 lets one core check).
var DefaultLimits = Limits{
	AccountFailures: 5,
	AccountWindow:   15 * time.Minute,
	AddressBurst:    20,
	AddressWindow:   15 * time.Minute,
	GlobalBurst:     300,
	GlobalWindow:    time.Minute,
}

// Bucket scopes (login_buckets.scope).
const (
	scopeAddress = "address"
	scopeGlobal  = "global"
)

// AddressKey is the throttle's name for a client address: the address itself for IPv4, its /64
// for IPv6 (one subscriber usually holds a whole /64, so counting single IPv6 addresses would
// let one attacker rotate through 2^64 of them), "unknown" when it does not parse.
func AddressKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return "unknown"
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// takeBucket takes one unit from a leaky bucket if it has room: the level drains at burst per
// window, continuously, and the statement is one atomic upsert whose WHERE refuses a full
// bucket (no row returned). ok is false when the bucket is full.
func takeBucket(ctx context.Context, tx pgx.Tx, scope, key string, burst int, window time.Duration, now time.Time) (ok bool, err error) {
	rate := float64(burst) / window.Seconds()
	var level float64
	err = tx.QueryRow(ctx, `INSERT INTO login_buckets AS b (scope, key, level, updated_at) VALUES ($1, $2, 1, $3::timestamptz)
		ON CONFLICT (scope, key) DO UPDATE
			SET level = greatest(0, b.level - greatest(0, extract(epoch FROM $3::timestamptz - b.updated_at)::float8) * $4::float8) + 1,
			    updated_at = greatest(b.updated_at, $3::timestamptz)
			WHERE greatest(0, b.level - greatest(0, extract(epoch FROM $3::timestamptz - b.updated_at)::float8) * $4::float8) + 1 <= $5
		RETURNING level`, scope, key, now, rate, float64(burst)).Scan(&level)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, payments.DBError("sign-in throttle: "+scope, err, "")
	}
	return true, nil
}

// bucketWait is how long until a full bucket has room for one more attempt. It reads through
// tx, the transaction whose takeBucket found the bucket full (and so holds its row lock): a
// read through the pool would need a second connection while the lock is held, and under a
// flood of sign-ins every other connection is waiting for that very lock.
func bucketWait(ctx context.Context, tx pgx.Tx, scope, key string, burst int, window time.Duration, now time.Time) time.Duration {
	var level float64
	var at time.Time
	if err := tx.QueryRow(ctx, `SELECT level, updated_at FROM login_buckets WHERE scope = $1 AND key = $2`, scope, key).Scan(&level, &at); err != nil {
		return window
	}
	rate := float64(burst) / window.Seconds()
	level -= math.Max(0, now.Sub(at).Seconds()) * rate
	wait := time.Duration((level + 1 - float64(burst)) / rate * float64(time.Second))
	return max(wait, time.Second)
}

// giveBack returns an attempt's unit to a bucket (the attempt was no failure).
func giveBack(ctx context.Context, tx pgx.Tx, scope, key string) error {
	if _, err := tx.Exec(ctx, `UPDATE login_buckets SET level = greatest(0, level - 1) WHERE scope = $1 AND key = $2`, scope, key); err != nil {
		return payments.DBError("sign-in throttle: give back", err, "")
	}
	return nil
}

// countAccountFailure counts one (presumed) failure for the email, unless the email is locked.
// A failure more than AccountWindow after the previous one, or after a lock ran out, starts a
// fresh count; the one that reaches AccountFailures sets the lock at once, so a parallel guess
// already finds it. locked is true when the email was locked before this attempt.
func (s *Service) countAccountFailure(ctx context.Context, tx pgx.Tx, email string, now time.Time) (failures int, locked bool, err error) {
	err = tx.QueryRow(ctx, `INSERT INTO staff_login_throttle AS t (email, failures, last_failure_at) VALUES ($1, 1, $2)
		ON CONFLICT (email) DO UPDATE SET
			failures = CASE WHEN t.locked_until IS NOT NULL OR t.last_failure_at IS NULL OR t.last_failure_at <= $3
				THEN 1 ELSE t.failures + 1 END,
			last_failure_at = $2,
			locked_until = NULL
			WHERE t.locked_until IS NULL OR t.locked_until <= $2
		RETURNING failures`, email, now, now.Add(-s.Limits.AccountWindow)).Scan(&failures)
	if err == pgx.ErrNoRows {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, payments.DBError("sign-in throttle: account", err, "")
	}
	if failures >= s.Limits.AccountFailures {
		if _, err := tx.Exec(ctx, `UPDATE staff_login_throttle SET locked_until = $2 WHERE email = $1`,
			email, now.Add(s.Limits.AccountWindow)); err != nil {
			return 0, false, payments.DBError("sign-in throttle: lock account", err, "")
		}
	}
	return failures, false, nil
}

// accountLockedError is the answer while an email is locked. Like bucketWait it reads through
// tx, the transaction that found the lock (and holds the email's row): never through the pool
// while the throttle's rows are locked.
func (s *Service) accountLockedError(ctx context.Context, tx pgx.Tx, email string, now time.Time) error {
	var until *time.Time
	_ = tx.QueryRow(ctx, `SELECT locked_until FROM staff_login_throttle WHERE email = $1`, email).Scan(&until)
	if until == nil {
		t := now.Add(s.Limits.AccountWindow)
		until = &t
	}
	return lockedUntilError(*until, now)
}

// lockedUntilError says until when (and, in RetryAfter, how long from now) an email is locked.
// The time shown is the lock's end rounded up to the minute: cut down, "after 12:15" for a lock
// ending at 12:15:40 sent the one who waited as told back to a refusal.
func lockedUntilError(until, now time.Time) error {
	shown := until.UTC().Add(time.Minute - time.Nanosecond).Truncate(time.Minute)
	return &payments.Error{Code: payments.ELOCKED, Field: "email", RetryAfter: until.Sub(now),
		Message: fmt.Sprintf("too many failed sign-ins; try again after %s UTC", shown.Format("15:04"))}
}

// ReapThrottle deletes, in one bounded batch each, throttle rows that count for nothing any
// more: address buckets that have drained empty, and per-email counts whose last failure is
// older than AccountWindow with no lock in force. Every failed sign-in reaps a few (so the
// tables never hold much more than the live rows, whatever an attacker sends); a successful one
// reaps a full batch. A row another transaction holds is skipped, not waited for: the reaping
// runs inside a sign-in, which must not wait on it (an outside review).
func (s *Service) ReapThrottle(ctx context.Context, batch int) (int64, error) {
	now := s.clock.Now()
	tag, err := s.db.Exec(ctx, `DELETE FROM login_buckets WHERE scope = $1 AND key IN (
		SELECT key FROM login_buckets WHERE scope = $1 AND updated_at < $2 LIMIT $3 FOR UPDATE SKIP LOCKED)`,
		scopeAddress, now.Add(-s.Limits.AddressWindow), batch)
	if err != nil {
		return 0, fmt.Errorf("reap login buckets: %w", err)
	}
	n := tag.RowsAffected()
	tag, err = s.db.Exec(ctx, `DELETE FROM staff_login_throttle WHERE email IN (
		SELECT email FROM staff_login_throttle WHERE last_failure_at < $1 AND (locked_until IS NULL OR locked_until < $2) LIMIT $3 FOR UPDATE SKIP LOCKED)`,
		now.Add(-s.Limits.AccountWindow), now, batch)
	if err != nil {
		return n, fmt.Errorf("reap login throttle: %w", err)
	}
	n += tag.RowsAffected()
	tag, err = s.db.Exec(ctx, `DELETE FROM staff_devices WHERE token_hash IN (
		SELECT token_hash FROM staff_devices WHERE last_used_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`, now.Add(-DeviceTTL), batch)
	if err != nil {
		return n, fmt.Errorf("reap devices: %w", err)
	}
	return n + tag.RowsAffected(), nil
}
