package payments

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
)

// staffSessionKey marks a request made in a signed-in console session (web/auth's Require).
type staffSessionKey struct{}

// StaffSession is the console session a request runs in: its user, the role the request was let
// through with, and the session epoch it signed in under (staff_users.session_epoch then).
type StaffSession struct {
	Email string
	Role  string
	Epoch int
}

// WithStaffSession marks ctx as a request of email's console session signed in under epoch.
// Require looked at the user when the request began; an action that then waits for a lock (a
// payment's, a user's) may run after the user was disabled or given a new password meanwhile.
// Every change made under a payment's locks (lockOrderAndSession) and every change of staff
// users (access) checks the session again under its locks and is refused when it no longer
// stands (ErrStaffSessionEnded): an offboarding that lands first cannot be outrun by the
// offboarded user's last click (outside reviews). So is one whose user has another role now: a
// finance user made support while their approval waited for the payment's locks approved
// all the same (an outside review); the role the request was let through with (role) must
// still be the user's. Create's claim checks it under the order's lock. What the gateway did on
// a decision that stood when it committed is recorded whoever the user is by then: records
// made under detachRecord carry no staff session (withoutStaffSession).
func WithStaffSession(ctx context.Context, email, role string, epoch int) context.Context {
	return context.WithValue(ctx, staffSessionKey{}, StaffSession{Email: strings.ToLower(strings.TrimSpace(email)), Role: role, Epoch: epoch})
}

// StaffSessionFrom is the console session ctx runs in (WithStaffSession), if any.
func StaffSessionFrom(ctx context.Context) (StaffSession, bool) {
	ss, ok := ctx.Value(staffSessionKey{}).(StaffSession)
	return ss, ok
}

// withoutStaffSession is ctx with no console session: the work it runs no longer depends on the
// user's standing (detachRecord).
func withoutStaffSession(ctx context.Context) context.Context {
	if _, ok := StaffSessionFrom(ctx); !ok {
		return ctx
	}
	return context.WithValue(ctx, staffSessionKey{}, nil)
}

// ErrStaffSessionEnded refuses a change whose console session ended while it waited.
var ErrStaffSessionEnded = &Error{Code: EUNAUTHENTICATED,
	Message: "your session ended while this was on its way (your account was disabled, or given a new password): nothing was changed"}

// ErrStaffRoleChanged refuses a change whose user was given another role while it waited.
var ErrStaffRoleChanged = &Error{Code: EFORBIDDEN,
	Message: "your role changed while this was on its way: nothing was changed; reload the page"}

// staffStands is queueStaffStands on its own, for a change whose lock was taken by the statement
// before: a finance action that waited for its row (a case, a flag, a proposal, the codes of a
// payment) while its user was disabled or made support went through under the old role (outside
// reviews).
func staffStands(ctx context.Context, tx pgx.Tx) error {
	var b pgx.Batch
	if queueStaffStands(ctx, &b); b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, &b).Close()
}

// queueStaffStands queues, when ctx runs in a console session, the look at its user under a
// share lock (an offboarding of the user waits for this transaction, or this one for it), refusing
// with ErrStaffSessionEnded when the user is gone, disabled, or on another session epoch, and
// with ErrStaffRoleChanged when the user's role is no longer the one the request was let through
// with.
func queueStaffStands(ctx context.Context, b *pgx.Batch) {
	ss, ok := StaffSessionFrom(ctx)
	if !ok {
		return
	}
	b.Queue(`SELECT disabled_at IS NULL AND session_epoch = $2, role = $3 OR $3 = '' FROM staff_users WHERE email = $1 FOR SHARE`,
		ss.Email, ss.Epoch, ss.Role).
		QueryRow(func(r pgx.Row) error {
			var stands, sameRole bool
			err := r.Scan(&stands, &sameRole)
			switch {
			case errors.Is(err, pgx.ErrNoRows) || (err == nil && !stands):
				return ErrStaffSessionEnded
			case err != nil:
				return dbError("staff session", err, "")
			case !sameRole:
				return ErrStaffRoleChanged
			}
			return nil
		})
}
