package payments

import (
	"context"
	"errors"
	"fmt"
	"net/mail"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/crypto/bcrypt"
)

// Role is what a staff user may do in the console (design.md, "Who uses it").
type Role string

const (
	// RoleSupport looks payments up, starts them for customers, checks and cancels them.
	RoleSupport Role = "support"
	// RoleFinance reads everything, works the finance pages and resolves cases; it moves no payment.
	RoleFinance Role = "finance"
	// RoleAdmin does everything, and alone sees the outbox (it holds cancel codes), users and audit.
	RoleAdmin Role = "admin"
)

// Roles in display order.
var Roles = []Role{RoleSupport, RoleFinance, RoleAdmin}

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return r == RoleSupport || r == RoleFinance || r == RoleAdmin }

// Permission is one thing a console page or action needs.
type Permission string

const (
	// PermView: dashboard, payments and their details, leases and locks (nothing secret).
	PermView Permission = "view"
	// PermOperate: start a payment, Check it, request and confirm a cancel.
	PermOperate Permission = "operate"
	// PermFinance: finance pages (open cases, flagged sessions, ledger).
	PermFinance Permission = "finance"
	// PermResolve: resolve a finance case, send a flagged session back to the patrol.
	PermResolve Permission = "resolve"
	// PermAdmin: the outbox (message bodies contain one-time cancel codes), users, audit log.
	PermAdmin Permission = "admin"
)

// rolePermissions is THE roles matrix; pages and actions ask Role.Can, never the role name.
var rolePermissions = map[Role][]Permission{
	RoleSupport: {PermView, PermOperate},
	RoleFinance: {PermView, PermFinance, PermResolve},
	RoleAdmin:   {PermView, PermOperate, PermFinance, PermResolve, PermAdmin},
}

// Can reports whether the role has permission p.
func (r Role) Can(p Permission) bool {
	for _, q := range rolePermissions[r] {
		if q == p {
			return true
		}
	}
	return false
}

// StaffUser is a person who signs in to the console.
type StaffUser struct {
	ID         int64
	Email      string
	Role       Role
	CreatedAt  time.Time
	DisabledAt *time.Time
}

// Staff is who did something in the console, for the audit log and the timeline.
type Staff struct {
	Email string
	Role  Role
}

// Actor is the staff user as the core's actor.
func (s Staff) Actor() Actor { return Actor{Kind: ActorStaff, ID: s.Email} }

// Password rules. bcrypt reads at most 72 bytes; a longer password would be silently cut, so it
// is refused instead.
const (
	MinPasswordLength = 12
	MaxPasswordBytes  = 72
)

// Sign-in throttling: MaxLoginFailures wrong passwords in a row lock the email for LoginLockout.
const (
	MaxLoginFailures = 5
	LoginLockout     = 15 * time.Minute
)

// PasswordCost is the bcrypt cost of new password hashes (the cost is stored in each hash, so
// changing it affects only new ones). Tests lower it in TestMain.
var PasswordCost = 12

// dummyHash is compared against when the email is unknown, so that a sign-in takes as long for
// an unknown email as for a wrong password.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("pitlane-no-such-user"), bcrypt.MinCost)

// NormalizeEmail is the form emails are stored and looked up in.
func NormalizeEmail(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

// ValidateStaffUser checks a new user's email, role and password and names the field at fault.
func ValidateStaffUser(email string, role Role, password string) error {
	addr, err := mail.ParseAddress(email)
	if err != nil || addr.Address != email || addr.Name != "" || len(email) > 254 {
		return Invalid("email", "email %q is not a plain email address", email)
	}
	if !role.Valid() {
		return Invalid("role", "role must be one of support, finance, admin")
	}
	if len([]rune(password)) < MinPasswordLength {
		return Invalid("password", "the password must be at least %d characters", MinPasswordLength)
	}
	if len(password) > MaxPasswordBytes {
		return Invalid("password", "the password must be at most %d bytes", MaxPasswordBytes)
	}
	return nil
}

// CreateStaffUser adds a console user. The password is stored as a bcrypt hash only.
// ECONFLICT when the email is taken.
func (s *Service) CreateStaffUser(ctx context.Context, email string, role Role, password string) (StaffUser, error) {
	email = NormalizeEmail(email)
	if err := ValidateStaffUser(email, role, password); err != nil {
		return StaffUser{}, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), PasswordCost)
	if err != nil {
		return StaffUser{}, fmt.Errorf("create staff user: hash: %w", err)
	}
	u, err := scanStaffUser(s.db.QueryRow(ctx, `INSERT INTO staff_users (email, role, password_hash, created_at)
		VALUES ($1, $2, $3, $4) RETURNING `+staffColumns, email, string(role), string(hash), s.cfg.Clock.Now()))
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "staff_users_email_key" {
			return StaffUser{}, &Error{Code: ECONFLICT, Field: "email", Message: fmt.Sprintf("a staff user %s already exists", email), Err: err}
		}
		return StaffUser{}, fmt.Errorf("create staff user: %w", err)
	}
	return u, nil
}

// EnsureStaffUser creates the user unless the email exists already (then it changes nothing):
// for demo logins that `pitlane dev` prints on every start.
func (s *Service) EnsureStaffUser(ctx context.Context, email string, role Role, password string) (created bool, err error) {
	_, err = s.CreateStaffUser(ctx, email, role, password)
	if ErrorCode(err) == ECONFLICT {
		return false, nil
	}
	return err == nil, err
}

const staffColumns = `id, email, role, created_at, disabled_at`

func scanStaffUser(row pgx.Row) (StaffUser, error) {
	var u StaffUser
	var role string
	err := row.Scan(&u.ID, &u.Email, &role, &u.CreatedAt, &u.DisabledAt)
	u.Role = Role(role)
	return u, err
}

// StaffUser returns the user with this email (ENOTFOUND when there is none).
func (s *Service) StaffUser(ctx context.Context, email string) (StaffUser, error) {
	u, err := scanStaffUser(s.db.QueryRow(ctx, `SELECT `+staffColumns+` FROM staff_users WHERE email = $1`, NormalizeEmail(email)))
	if err != nil {
		return StaffUser{}, dbError("get staff user", err, "no staff user %s", email)
	}
	return u, nil
}

// ListStaffUsers returns every console user, by email.
func (s *Service) ListStaffUsers(ctx context.Context) ([]StaffUser, error) {
	rows, err := s.db.Query(ctx, `SELECT `+staffColumns+` FROM staff_users ORDER BY email`)
	if err != nil {
		return nil, fmt.Errorf("list staff users: %w", err)
	}
	users, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StaffUser, error) { return scanStaffUser(r) })
	if err != nil {
		return nil, fmt.Errorf("list staff users: %w", err)
	}
	return users, nil
}

// errWrongLogin is AuthenticateStaff's answer to a wrong password, an unknown email and a disabled
// user alike (EWRONG → 422); the other refusal is ELOCKED (→ 429) with the time it ends.
var errWrongLogin = &Error{Code: EWRONG, Field: "password", Message: "wrong email or password"}

// AuthenticateStaff checks an email and password. Throttled per email in PostgreSQL: after
// MaxLoginFailures wrong attempts in a row the email is locked for LoginLockout and even the
// right password is refused (ELOCKED) without being looked at. Unknown emails and disabled users
// get the same answer as a wrong password, after the same bcrypt work.
//
// The throttle row is locked FOR UPDATE for the whole judgement (one bcrypt comparison, no
// network call), so concurrent guesses for one email queue up and are counted one by one.
func (s *Service) AuthenticateStaff(ctx context.Context, email, password string) (StaffUser, error) {
	email = NormalizeEmail(email)
	if email == "" || len(email) > 254 {
		return StaffUser{}, errWrongLogin
	}
	now := s.cfg.Clock.Now()
	var (
		user   StaffUser
		result error
	)
	err := s.inTx(ctx, "authenticate staff", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO staff_login_throttle (email) VALUES ($1) ON CONFLICT (email) DO NOTHING`, email); err != nil {
			return fmt.Errorf("login throttle: %w", err)
		}
		var failures int
		var lockedUntil *time.Time
		if err := tx.QueryRow(ctx, `SELECT failures, locked_until FROM staff_login_throttle WHERE email = $1 FOR UPDATE`, email).
			Scan(&failures, &lockedUntil); err != nil {
			return dbError("login throttle: lock", err, "")
		}
		if lockedUntil != nil && lockedUntil.After(now) {
			result = &Error{Code: ELOCKED, Field: "email", Message: fmt.Sprintf("too many failed sign-ins; try again after %s UTC", lockedUntil.UTC().Format("15:04"))}
			return nil
		}
		if lockedUntil != nil { // the lock ran out: a fresh start
			failures = 0
		}
		var hash string
		u, err := scanStaffUserHash(tx.QueryRow(ctx, `SELECT `+staffColumns+`, password_hash FROM staff_users WHERE email = $1`, email), &hash)
		found := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("authenticate staff: %w", err)
		}
		if !found {
			hash = string(dummyHash)
		}
		ok := bcrypt.CompareHashAndPassword([]byte(hash), []byte(password)) == nil && found && u.DisabledAt == nil
		if ok {
			user = u
			_, err := tx.Exec(ctx, `DELETE FROM staff_login_throttle WHERE email = $1`, email)
			return err
		}
		failures++
		var until *time.Time
		if failures >= MaxLoginFailures {
			t := now.Add(LoginLockout)
			until = &t
		}
		if _, err := tx.Exec(ctx, `UPDATE staff_login_throttle SET failures = $2, last_failure_at = $3, locked_until = $4 WHERE email = $1`,
			email, failures, now, until); err != nil {
			return fmt.Errorf("login throttle: count: %w", err)
		}
		result = errWrongLogin
		if until != nil {
			result = &Error{Code: ELOCKED, Field: "email", Message: fmt.Sprintf("too many failed sign-ins; try again after %s UTC", until.UTC().Format("15:04"))}
		}
		return nil
	})
	if err != nil {
		return StaffUser{}, err
	}
	if result != nil {
		return StaffUser{}, result
	}
	return user, nil
}

func scanStaffUserHash(row pgx.Row, hash *string) (StaffUser, error) {
	var u StaffUser
	var role string
	err := row.Scan(&u.ID, &u.Email, &role, &u.CreatedAt, &u.DisabledAt, hash)
	u.Role = Role(role)
	return u, err
}
