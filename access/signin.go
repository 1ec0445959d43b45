package access

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments"
)

// Attempt is one sign-in: what the form sent and where it came from.
type Attempt struct {
	Email    string
	Password string
	// Address is the client's address as the web layer determined it (X-Forwarded-For only
	// from TRUSTED_PROXIES); the throttle counts per AddressKey of it.
	Address string
	// UserAgent goes into the audit entry of a successful sign-in.
	UserAgent string
	// Device is the browser's device token (RememberDevice), "" when it has none: trusted for
	// the attempt's email, the attempt takes one unit of the device's allowance instead of the
	// address and global buckets and the account's lock (devices.go). A spent allowance is no
	// trust: the attempt meets the throttle like any other.
	Device string
	// Reauth: a signed-in user proving their password again (ChangeOwnPassword). The same
	// throttle and failure count; a success writes no sign-in entry (the change writes its own).
	Reauth bool
}

// errWrongLogin is SignIn's answer to a wrong password, an unknown email and a disabled user
// alike (EWRONG → 422). The other refusals are ELOCKED (→ 429).
var errWrongLogin = &payments.Error{Code: payments.EWRONG, Field: "password", Message: "wrong email or password"}

// reapPerFailure is how many dead throttle rows each failed sign-in deletes on its way out.
const reapPerFailure = 10

// SignIn checks an email and password behind the throttle (see Limits) and returns the user.
//
// Nothing in its answer or its timing tells whether an email exists: an unknown email, a wrong
// password and a disabled user get the same EWRONG after the same work (the same throttle
// statements, one bcrypt comparison at the configured cost, against a dummy hash when there is
// no user), and a lockout counts unknown emails too. What differs is invisible to the caller:
// the audit log records failures of real accounts only (failures of made-up emails are counted
// per address, not written down one by one).
//
// No statement goes through the pool while the throttle's transaction is open: it holds the
// rows every other attempt from the same address (and every attempt at all, the global bucket)
// waits for, so under a flood every other connection of the pool is taken by such a waiter, and
// a lock holder waiting for a connection would stall the replica's database access until
// lock_timeout, again and again. What a refusal says (how long to wait) is read through the
// transaction itself.
func (s *Service) SignIn(ctx context.Context, a Attempt) (User, error) {
	// Cut on a character: half of one is no UTF-8, which PostgreSQL refuses in the throttle's
	// first statement, so the attempt was an error that counted nothing.
	email := cutText(NormalizeEmail(a.Email), 254)
	now := s.clock.Now()
	addr := AddressKey(a.Address)

	// 1. Take the attempt's units: a trusted device's allowance, or else address, global,
	// account (this order everywhere, so the rows are locked in one order). A refusal rolls back
	// what was taken: a throttled attempt costs nothing and writes nothing. Every statement of
	// the transaction goes through tx (see above).
	var refusal error
	var failures int // this attempt's place in the account's run of failures, if it fails
	trusted := false // a device that signed in to this account before, with allowance left (devices.go)
	// Only this transaction waits for room (enterSignIn): it is what a flood queues on the
	// buckets' rows with. What follows is bounded by the buckets' own rates (a throttled attempt
	// ends here); held across bcrypt, which holds no connection, the room let a dozen guesses
	// within their buckets keep a trusted device out (a review).
	if err := s.enterSignIn(ctx); err != nil {
		return User{}, err
	}
	err := s.inTx(ctx, "sign in: throttle", func(tx pgx.Tx) error {
		var err error
		if trusted, err = s.claimDevice(ctx, tx, a.Device, email, now); err != nil || trusted {
			return err // trusted: the device's unit is taken; no bucket, no lock
		}
		ok, err := takeBucket(ctx, tx, scopeAddress, addr, s.Limits.AddressBurst, s.Limits.AddressWindow, now)
		if err != nil {
			return err
		}
		if !ok {
			wait := bucketWait(ctx, tx, scopeAddress, addr, s.Limits.AddressBurst, s.Limits.AddressWindow, now)
			refusal = &payments.Error{Code: payments.ELOCKED, Field: "email", RetryAfter: wait, Message: fmt.Sprintf(
				"too many failed sign-ins from your network; try again in %s", payments.RoundUpWait(wait))}
			return errRollback
		}
		if ok, err = takeBucket(ctx, tx, scopeGlobal, "", s.Limits.GlobalBurst, s.Limits.GlobalWindow, now); err != nil {
			return err
		}
		if !ok {
			refusal = &payments.Error{Code: payments.ELOCKED, Field: "email", RetryAfter: time.Minute,
				Message: "too many sign-in attempts right now; try again in a minute"}
			return errRollback
		}
		if !strings.Contains(email, "@") {
			// No account's name: a password typed into the e-mail field, which the account's
			// count would have kept in clear in staff_login_throttle for its window (an outside
			// review, privacy). The address and global buckets counted it.
			return nil
		}
		var locked bool
		failures, locked, err = s.countAccountFailure(ctx, tx, email, now)
		if err != nil {
			return err
		}
		if locked {
			refusal = s.accountLockedError(ctx, tx, email, now)
			return errRollback
		}
		return nil
	})
	<-s.signIns
	if refusal != nil {
		return User{}, refusal
	}
	if err != nil {
		return User{}, err
	}

	// 2. Judge the password with no transaction open (bcrypt is the slow part). The dummy hash
	// is made on the process's first attempt whatever its email, before the look-up: made only
	// for an unknown email, it would make the first unknown email after a start twice as slow
	// as a wrong password, telling that the account does not exist.
	dummy, err := s.dummyHash()
	if err != nil {
		return User{}, fmt.Errorf("sign in: dummy hash: %w", err)
	}
	var hash string
	u, err := scanUser(s.db.QueryRow(ctx, `SELECT `+userColumns+`, password_hash FROM staff_users WHERE email = $1`, email), &hash)
	found := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return User{}, fmt.Errorf("sign in: %w", err)
	}
	if !found {
		hash = string(dummy)
	}
	match := passwordMatches(hash, a.Password)

	// 3a. Signed in: give the address and global units back (only the attempt's own: signing in
	// to one's own account must not wash away one's failures on others), or a trusted device its
	// allowance; clear the account's count.
	if match && found && !u.Disabled() {
		err := s.inTx(ctx, "sign in: success", func(tx pgx.Tx) error {
			if trusted { // a trusted attempt took the device's unit, no bucket's
				if err := deviceSignedIn(ctx, tx, a.Device); err != nil {
					return err
				}
			} else {
				if err := giveBack(ctx, tx, scopeAddress, addr); err != nil {
					return err
				}
				if err := giveBack(ctx, tx, scopeGlobal, ""); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `DELETE FROM staff_login_throttle WHERE email = $1`, email); err != nil {
				return fmt.Errorf("sign in: clear throttle: %w", err)
			}
			if a.Reauth {
				return nil // proving a password again is no sign-in: the change it allows writes its own entry
			}
			return payments.AppendAudit(ctx, tx, payments.AuditEntry{Actor: u.Email, Role: string(u.Role), Action: payments.AuditLogin,
				Target: u.Email, Detail: strings.TrimSpace("from " + a.Address + " " + storableHeader(a.UserAgent))}, now)
		})
		if err != nil {
			return User{}, err
		}
		return u, nil
	}

	// 3b. Refused: the failure is already counted (a trusted device's, on the device: the unit
	// its claim took). A real account's failures are audited.
	//
	// One statement for a real account and a made-up email alike, so a failure's last write
	// tells nothing either: the account's throttle row (step 1 wrote one for both; none for text
	// with no @, which everyone can tell is no account) is written again, which makes the commit
	// flush the WAL in both cases, and a real account's failure
	// is audited in the same statement (a made-up email's inserts no row). An audit INSERT of
	// its own, for real accounts only, was a round trip and a WAL flush more that timed the
	// difference (TestFailedSignInsSendTheSameStatements).
	detail := "from " + a.Address
	if a.Reauth {
		detail += ", proving the password again (password change)"
	}
	actx, cancel := payments.Outlive(ctx, payments.RecordGrace) // the failure is counted: its audit outlives the request
	defer cancel()
	if _, err := s.db.Exec(actx, `WITH audit AS (
			INSERT INTO audit_log (at, actor, role, action, target, detail) SELECT $2, $1, '', $3, $1, $4 WHERE $5)
		UPDATE staff_login_throttle SET last_failure_at = last_failure_at WHERE email = $1`,
		email, now, payments.AuditLoginFailed, detail, found); err != nil {
		return User{}, fmt.Errorf("sign in: failure: %w", err)
	}
	if _, err := s.ReapThrottle(ctx, reapPerFailure); err != nil {
		return User{}, err
	}
	if !trusted && failures >= s.Limits.AccountFailures { // this failure set the lock
		return User{}, lockedUntilError(now.Add(s.Limits.AccountWindow), now)
	}
	return User{}, errWrongLogin
}

// enterSignIn waits for room among the sign-ins using the database (signInRoom), holding no
// connection, at most signInWait (half of what ctx has left, when less): then the attempt is
// refused as throttled (ELOCKED, 429 with Retry-After) having counted nothing.
func (s *Service) enterSignIn(ctx context.Context) error {
	select {
	case s.signIns <- struct{}{}:
		return nil
	default:
	}
	wait := signInWait
	if end, ok := ctx.Deadline(); ok { // the refusal is answered within the request's own limit
		wait = min(wait, time.Until(end)/2)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case s.signIns <- struct{}{}:
		return nil
	case <-timer.C:
	case <-ctx.Done():
	}
	return &payments.Error{Code: payments.ELOCKED, Field: "email", RetryAfter: 5 * time.Second,
		Message: "too many sign-ins at once right now; try again in a few seconds"}
}

// maxAuditedHeader is how much of a request header (the User-Agent) a sign-in's audit entry keeps.
const maxAuditedHeader = 512

// storableHeader is a header's value as an audit entry can hold it: a NUL or a sequence that is
// not UTF-8 (Go's server accepts such bytes in a header; PostgreSQL refuses to store them)
// becomes U+FFFD and it is cut to maxAuditedHeader bytes on a character. The browser's
// User-Agent is not the user's to fix: it refused a right password with "characters that cannot
// be stored", and the attempt's throttle units stayed spent (an outside review).
func storableHeader(v string) string {
	return cutText(storableText(strings.TrimSpace(v)), maxAuditedHeader)
}

// errRollback ends a transaction without committing and without being an error to the caller.
var errRollback = errors.New("rollback")

// ChangeOwnPassword replaces a signed-in user's password once they prove the current one. The
// proof is a sign-in attempt (Attempt.Reauth): the same throttle, the same failure count and
// lockout of the account, the same audit entry for a failure. So a console session someone else
// got hold of neither changes the password without knowing it nor guesses it faster than the
// sign-in page allows. The new password ends every session of the user and forgets their
// trusted devices (SetPassword); the caller starts the current session again. Whoever set the
// password before stays recorded (passwordSetter): the account's owner changing it cannot be
// told from that person.
//
// epoch is the session epoch of the caller's console session. The new password is written only
// while the account still has it (staleEpoch): between the proof and the write (two bcrypt runs)
// an admin may set a new password because the account was taken over, and a change proven with
// the old password must not replace the admin's (an outside review).
func (s *Service) ChangeOwnPassword(ctx context.Context, a Attempt, epoch int, password string) (User, error) {
	if err := ValidatePassword(password); err != nil { // a bad new password costs no attempt
		return User{}, err
	}
	a.Reauth = true
	u, err := s.SignIn(ctx, a)
	if payments.ErrorCode(err) == payments.EWRONG {
		return User{}, &payments.Error{Code: payments.EWRONG, Field: "current_password", Message: "your current password is not the one you typed"}
	} else if err != nil {
		return User{}, err
	}
	return s.setPassword(ctx, u.Staff(), u.Email, password, &epoch)
}
