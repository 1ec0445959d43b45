package access

import (
	"context"
	"errors"
	"fmt"
	"net/mail"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/mtibben/confusables"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/net/idna"
	"golang.org/x/text/unicode/norm"

	"pitlane/payments"
)

// Role is what a staff user may do in the console (design.md, "Who uses it").
type Role string

const (
	// RoleSupport looks payments up, starts them for customers, checks and cancels them, and
	// refunds them with the customer's one-time code.
	RoleSupport Role = "support"
	// RoleFinance reads everything, works the finance pages, resolves cases and refunds (within
	// the direct limit alone, above it with a second person); it starts and cancels no payment.
	RoleFinance Role = "finance"
	// RoleAdmin does everything, and alone sees the outbox (it holds one-time codes), users and audit.
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
	// PermOperate: start a payment, Check it, request and confirm a cancel, refund with the
	// customer's code.
	PermOperate Permission = "operate"
	// PermFinance: finance pages (open cases, flagged sessions, ledger).
	PermFinance Permission = "finance"
	// PermResolve: resolve a finance case, send a flagged session back to the patrol, settle or
	// refund (directly, or propose and approve: four eyes).
	PermResolve Permission = "resolve"
	// PermAdmin: the outbox (message bodies contain one-time codes), users, audit log.
	PermAdmin Permission = "admin"
)

// Permissions in the order the docs list them.
var Permissions = []Permission{PermView, PermOperate, PermFinance, PermResolve, PermAdmin}

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

// User is a person who signs in to the console.
type User struct {
	ID         int64
	Email      string
	Role       Role
	CreatedAt  time.Time
	DisabledAt *time.Time
	// SessionEpoch changes with the password: a console session signed in under another epoch
	// is over.
	SessionEpoch int
}

// Disabled reports whether the user may no longer sign in.
func (u User) Disabled() bool { return u.DisabledAt != nil }

// Staff is the user as the core records who acted.
func (u User) Staff() payments.Staff { return payments.Staff{Email: u.Email, Role: string(u.Role)} }

// Password rules. bcrypt reads at most 72 bytes; a longer password would be silently cut, so it
// is refused instead.
const (
	MinPasswordLength = 12
	MaxPasswordBytes  = 72
)

// NormalizeEmail is the form emails are stored and looked up in.
//
// Bytes no email can hold (a NUL, a sequence that is not UTF-8) become U+FFFD, so such an input
// is one more unknown email — refused, timed and throttled like any other — and never reaches
// PostgreSQL, which refuses to store them.
//
// And in Unicode's composed form (NFC): "josé" typed as e and a combining accent is the same
// address as with é, not a second account that looks like the first (an outside review).
// Composed after lower-casing too: lower-casing can undo a composition ("İ" and an accent
// becomes "i" and the accent), and a stored form that normalized to another address took every
// later look-up of that row to the account it looks like (an outside review). Normalizing a
// normalized email changes nothing (TestNormalizeEmailIsStable).
func NormalizeEmail(s string) string {
	return norm.NFC.String(strings.ToLower(norm.NFC.String(strings.TrimSpace(storableText(s)))))
}

// storableText is s with the bytes PostgreSQL refuses to store in text (a NUL, a sequence that is
// not UTF-8) made U+FFFD.
func storableText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
}

// cutText is s cut to at most n bytes on a character (half of one is no UTF-8).
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// CheckAddress checks that email is written as one plain address: what names an existing account
// (the command line's user disable, role, password). An account created before a rule of
// ValidateEmail (U+FFFD, an invisible character) must stay reachable, or it could not be
// offboarded from the command line (a review of the U+FFFD rule).
func CheckAddress(email string) error {
	addr, err := mail.ParseAddress(email)
	if err != nil || addr.Address != email || addr.Name != "" || len(email) > 254 {
		return payments.Invalid("email", "email %q is not a plain email address", email)
	}
	return nil
}

// ValidateEmail checks that email may be a new account's: one plain address (CheckAddress) that
// is text a browser can type and that holds no character nobody sees.
func ValidateEmail(email string) error {
	if err := CheckAddress(email); err != nil {
		return err
	}
	if strings.ContainsRune(email, utf8.RuneError) {
		// A byte that is not UTF-8 (an address typed in a Latin-1 terminal, read from a Latin-1
		// file: "jos\xe9") is U+FFFD once normalized: an account no browser can name, and one
		// every other such spelling names too (an outside review, cli).
		return payments.Invalid("email", "email %q is not UTF-8 text (or holds U+FFFD)", email)
	}
	if strings.IndexFunc(email, invisible) >= 0 {
		// root@example.com with a zero-width space in it was a second admin that looked like the
		// first in every list, and stayed enabled when the first was offboarded (an outside
		// review). No address holds a character nobody sees.
		return payments.Invalid("email", "email %q holds an invisible character (a zero-width space, a direction mark, a byte-order mark…)", email)
	}
	if dotOverSoftDotted(email) {
		// "admi\u0307n": a dot above an i takes the place of its own dot, and the address reads
		// as admin (a review): NFC keeps it, and the mark is of no script.
		return payments.Invalid("email", "email %q puts a dot above an i or j, which has its own: it could look like another address", email)
	}
	if mixed := mixedScripts(email); mixed != "" {
		// "rооt@example.com" with two Cyrillic o's was a second admin that looked like root in
		// every list (a review of access): letters of one script, or of the scripts one
		// language writes together (Unicode's "highly restrictive" level, UTS #39), in each
		// part of the address.
		return payments.Invalid("email", "email %q mixes the characters of %s in one part: it could look like another address", email, mixed)
	}
	return nil
}

// scriptsTogether are the scripts whose letters one address may mix besides a single one (UTS
// #39, "highly restrictive"): Latin with Japanese, Chinese or Korean writing.
var scriptsTogether = [][]string{
	{"Latin", "Han", "Hiragana", "Katakana"},
	{"Latin", "Han", "Bopomofo"},
	{"Latin", "Han", "Hangul"},
}

// mixedScripts names the scripts one part of an address mixes ("Latin and Cyrillic"), or ""
// when each part's characters are of one script or of a set scriptsTogether allows. The parts
// are the local part, whole ("ј.doe" with a Cyrillic ј is one part: a review), and each label of
// the domain, an IDNA label ("xn--…") read as the characters it spells: "иван@пример.рф" and
// "ivan@xn--e1afmkfd.xn--p1ai" are the same kind of address (a review: the punycode spelling was
// refused as Cyrillic and Latin). Digits count with their script (a Myanmar zero is Myanmar);
// ASCII digits, punctuation and combining marks (scripts Common and Inherited) count for none.
func mixedScripts(s string) string {
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return partScripts(s)
	}
	if mixed := partScripts(s[:at]); mixed != "" {
		return mixed
	}
	for _, part := range strings.Split(s[at+1:], ".") {
		if mixed := partScripts(readLabel(part)); mixed != "" {
			return mixed
		}
	}
	return ""
}

// readLabel is a domain label as it reads: an IDNA label ("xn--…", any case) decoded to the
// characters it spells, any other as it is.
func readLabel(label string) string {
	if lower := strings.ToLower(label); strings.HasPrefix(lower, "xn--") {
		if u, err := idna.Punycode.ToUnicode(lower); err == nil {
			return u
		}
	}
	return label
}

// partScripts is mixedScripts for one part of an address.
func partScripts(s string) string {
	var seen []string
	for _, r := range s {
		for name, table := range unicode.Scripts {
			if name != "Common" && name != "Inherited" && unicode.Is(table, r) && !slices.Contains(seen, name) {
				seen = append(seen, name)
			}
		}
	}
	if len(seen) <= 1 {
		return ""
	}
	for _, set := range scriptsTogether {
		if !slices.ContainsFunc(seen, func(n string) bool { return !slices.Contains(set, n) }) {
			return ""
		}
	}
	slices.Sort(seen)
	return strings.Join(seen[:len(seen)-1], ", ") + " and " + seen[len(seen)-1]
}

// dotOverSoftDotted reports a combining dot above (U+0307) right after a soft-dotted letter (i,
// j and their kin, whose own dot it takes the place of) or a dotless i or j, to which it gives
// the dot back (a review: "adm\u0131\u0307n" read as admin).
func dotOverSoftDotted(s string) bool {
	prev := rune(-1)
	for _, r := range s {
		if r == '\u0307' && (unicode.Is(unicode.Soft_Dotted, prev) || prev == '\u0131' || prev == '\u0237') {
			return true
		}
		prev = r
	}
	return false
}

// emailLookalike names the account among emails whose address looks like email (the same UTS
// #39 confusable skeleton, github.com/mtibben/confusables: "rооt", "r𝗈𝗈t", "r၀၀t" and "орѕ@рау.іо"
// look like "root" and "ops@pay.io"), or "" when none does. The script rules (mixedScripts) see
// one address; this sees it beside the others. Two ASCII addresses are never look-alikes here:
// the table's "rn" for "m" and "l" for "1" would refuse Dom beside Dorn, two people, with no way
// to make the account (a review); any terminal shows them apart.
func emailLookalike(email string, emails []string) string {
	skeleton := emailSkeleton(email)
	for _, other := range emails {
		if other != email && !(isASCII(email) && isASCII(other)) && emailSkeleton(other) == skeleton {
			return other
		}
	}
	return ""
}

// emailSkeleton is an address's confusable skeleton, of the address as it reads: IDNA labels
// ("xn--…") decoded (the same mailbox, one account), and the small palochka (U+04CF), which
// lower-casing makes of the capital the table maps to l, read as that capital (a review: "ӏее"
// beside "lee").
func emailSkeleton(email string) string {
	if at := strings.LastIndexByte(email, '@'); at >= 0 {
		labels := strings.Split(email[at+1:], ".")
		for i, l := range labels {
			labels[i] = readLabel(l)
		}
		email = email[:at+1] + strings.Join(labels, ".")
	}
	return confusables.Skeleton(strings.ReplaceAll(email, "\u04cf", "\u04c0"))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// invisible reports a character nobody sees as itself (payments.ShownAsIs): formatting
// characters (zero-width spaces and joiners, direction marks and isolates, byte-order marks,
// soft hyphens), control characters, private-use characters, combining grapheme joiners, Hangul
// fillers and variation selectors ("root\uFE00@example.com" looked like root: a review).
func invisible(r rune) bool { return !payments.ShownAsIs(r) }

// ValidateRole checks that role is one of Roles.
func ValidateRole(role Role) error {
	if !role.Valid() {
		return payments.Invalid("role", "role must be one of support, finance, admin")
	}
	return nil
}

// ValidatePassword checks a new password's length.
func ValidatePassword(password string) error {
	if len([]rune(password)) < MinPasswordLength {
		return payments.Invalid("password", "the password must be at least %d characters", MinPasswordLength)
	}
	if len(password) > MaxPasswordBytes {
		return payments.Invalid("password", "the password must be at most %d bytes", MaxPasswordBytes)
	}
	if !payments.PlainLine(password) {
		// Nobody could type it at the sign-in form: the user would be locked out.
		return payments.Invalid("password", "the password must be text you can type (UTF-8, no control characters)")
	}
	if strings.IndexFunc(password, untypable) >= 0 {
		// The same: a byte-order mark an editor put at the start of a password file set a
		// password nobody could sign in with (an outside review).
		return payments.Invalid("password", "the password holds an invisible character no keyboard types (a byte-order mark, a zero-width space, a direction mark)")
	}
	return nil
}

// ValidateUser checks a new user's email, role and password and names the field at fault.
func ValidateUser(email string, role Role, password string) error {
	if err := ValidateEmail(email); err != nil {
		return err
	}
	if err := ValidateRole(role); err != nil {
		return err
	}
	return ValidatePassword(password)
}

const userColumns = `id, email, role, created_at, disabled_at, session_epoch`

func scanUser(row pgx.Row, extra ...any) (User, error) {
	var u User
	var role string
	err := row.Scan(append([]any{&u.ID, &u.Email, &role, &u.CreatedAt, &u.DisabledAt, &u.SessionEpoch}, extra...)...)
	u.Role = Role(role)
	return u, err
}

// CreateUser adds a console user (the password is stored as a bcrypt hash only) and records
// who did it in the audit log, in the same transaction. ECONFLICT when the email is taken.
func (s *Service) CreateUser(ctx context.Context, by payments.Staff, email string, role Role, password string) (User, error) {
	email = NormalizeEmail(email)
	if err := ValidateUser(email, role, password); err != nil {
		return User{}, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), s.PasswordCost)
	if err != nil {
		return User{}, fmt.Errorf("create user: hash: %w", err)
	}
	now := s.clock.Now()
	setter, _ := passwordSetter(by, email) // nobody creates their own account
	var u User
	err = s.inTx(ctx, "create user", func(tx pgx.Tx) error {
		// No second account looks like one there is (emailLookalike), compared under one lock
		// for every creation: two look-alikes made at once do not both find none.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, 0)`, int32(payments.LockStaffEmails)); err != nil {
			return payments.DBError("create user: lock", err, "")
		}
		rows, err := tx.Query(ctx, `SELECT email FROM staff_users`)
		if err != nil {
			return payments.DBError("create user: emails", err, "")
		}
		emails, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return payments.DBError("create user: emails", err, "")
		}
		if other := emailLookalike(email, emails); other != "" {
			return &payments.Error{Code: payments.ECONFLICT, Field: "email", Err: errLookalike,
				Message: fmt.Sprintf("email %s looks like the existing account %s: choose another address", email, other)}
		}
		u, err = scanUser(tx.QueryRow(ctx, `INSERT INTO staff_users (email, role, password_hash, created_at, password_set_by)
			VALUES ($1, $2, $3, $4, $5) RETURNING `+userColumns, email, string(role), string(hash), now, setter))
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "staff_users_email_key" {
				return &payments.Error{Code: payments.ECONFLICT, Field: "email", Message: fmt.Sprintf("a staff user %s already exists", email), Err: err}
			}
			return payments.DBError("create user", err, "")
		}
		return payments.AppendAudit(ctx, tx, payments.AuditEntry{Actor: by.Email, Role: by.Role, Action: payments.AuditUserCreate,
			Target: u.Email, Detail: "role " + string(u.Role)}, now)
	})
	if err != nil {
		return User{}, err
	}
	return u, nil
}

// errLookalike marks CreateUser's refusal of an email that looks like another account's.
var errLookalike = errors.New("looks like another account")

// EnsureUser creates the user unless the email exists already (then it changes nothing): for
// the demo logins `pitlane dev` prints on every start. An email refused for looking like another
// account is that refusal, not "exists" (a review: dev's seeding then said the demo login was
// not found).
func (s *Service) EnsureUser(ctx context.Context, by payments.Staff, email string, role Role, password string) (created bool, err error) {
	_, err = s.CreateUser(ctx, by, email, role, password)
	if payments.ErrorCode(err) == payments.ECONFLICT && !errors.Is(err, errLookalike) {
		return false, nil
	}
	return err == nil, err
}

// SignsInWith reports whether an enabled user with this email has this password: what a banner
// asks before it prints a login (pitlane dev's demo logins). No throttle, no audit: it signs no
// one in. bcrypt is slow on purpose; this is for a handful of logins.
func (s *Service) SignsInWith(ctx context.Context, email, password string) (bool, error) {
	var hash string
	u, err := scanUser(s.db.QueryRow(ctx, `SELECT `+userColumns+`, password_hash FROM staff_users WHERE email = $1`, NormalizeEmail(email)), &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("user %s: %w", email, err)
	}
	return !u.Disabled() && passwordMatches(hash, password), nil
}

// passwordMatches compares password with a stored bcrypt hash. bcrypt reads 72 bytes at most and
// its compare cuts a longer password there without a word: a password of exactly 72 bytes
// signed in followed by anything (an outside review), two passwords taken for one. No password
// longer than MaxPasswordBytes is ever set (ValidatePassword), so a longer one matches none; the
// compare still runs, so the answer takes the time of any other.
func passwordMatches(hash, password string) bool {
	return bcrypt.CompareHashAndPassword([]byte(hash), []byte(password)) == nil && len(password) <= MaxPasswordBytes
}

// User returns the user with this email (ENOTFOUND when there is none): the row stored in
// exactly this form (typedForm), else the one with its normal form (storedFirst).
func (s *Service) User(ctx context.Context, email string) (User, error) {
	u, err := scanUser(s.db.QueryRow(ctx, `SELECT `+userColumns+` FROM staff_users WHERE email = $1 OR email = $2
		ORDER BY email = $1 DESC LIMIT 1`, typedForm(email), NormalizeEmail(email)))
	if err != nil {
		return User{}, payments.DBError("get user", err, "no staff user %s", email)
	}
	return u, nil
}

// UserNamed is the user an email typed by an operator names (the command line): the one row
// stored in its typed form or in its normal form. ECONFLICT when those are two rows — one
// stored before emails were composed, looking like the other account — since which of them is
// meant cannot be told from what was typed: the command line reset the look-alike admin's
// password when the old row's owner asked for a reset (an outside review). The Users page acts
// on the row.
func (s *Service) UserNamed(ctx context.Context, email string) (User, error) {
	rows, err := s.db.Query(ctx, `SELECT `+userColumns+` FROM staff_users WHERE email = $1 OR email = $2 ORDER BY id`,
		typedForm(email), NormalizeEmail(email))
	if err != nil {
		return User{}, payments.DBError("get user", err, "")
	}
	users, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (User, error) { return scanUser(r) })
	switch {
	case err != nil:
		return User{}, payments.DBError("get user", err, "")
	case len(users) == 0:
		return User{}, payments.Errorf(payments.ENOTFOUND, "no staff user %s", NormalizeEmail(email))
	case len(users) > 1:
		return User{}, payments.Errorf(payments.ECONFLICT, "two staff users look like %s: %+q (%s) and %+q (%s); change the one meant on the console's Users page",
			NormalizeEmail(email), users[0].Email, users[0].Role, users[1].Email, users[1].Role)
	}
	return users[0], nil
}

// UserByID returns the user with this id (ENOTFOUND when there is none).
func (s *Service) UserByID(ctx context.Context, id int64) (User, error) {
	u, err := scanUser(s.db.QueryRow(ctx, `SELECT `+userColumns+` FROM staff_users WHERE id = $1`, id))
	if err != nil {
		return User{}, payments.DBError("get user", err, "no staff user #%d", id)
	}
	return u, nil
}

// ListUsers returns every console user, by email.
func (s *Service) ListUsers(ctx context.Context) ([]User, error) {
	rows, err := s.db.Query(ctx, `SELECT `+userColumns+` FROM staff_users ORDER BY email`)
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	users, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (User, error) { return scanUser(r) })
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	return users, nil
}

// DisableUser offboards a user: they cannot sign in, and their sessions end at their next
// request (the console reads the user on every request). Their trusted devices are forgotten
// (devices.go). Disabling twice keeps the first time.
// The last enabled admin cannot be disabled (ECONFLICT): someone must be able to manage users.
func (s *Service) DisableUser(ctx context.Context, by payments.Staff, email string) (User, error) {
	return s.changeUser(ctx, by, email, userChange{disable: true})
}

// EnableUser undoes DisableUser: the user may sign in again with the password they had (an
// offboarding by mistake, or someone back from leave; give a new password with SetPassword when
// the old one may have been shared), a sign-in lockout of theirs lifted. The sessions and
// trusted devices the disable ended stay ended (the session epoch moves on again), and the
// four-eyes proposals it withdrew stay withdrawn (any it skipped are withdrawn now).
// Enabling an enabled user changes nothing (audited as "already enabled").
func (s *Service) EnableUser(ctx context.Context, by payments.Staff, email string) (User, error) {
	return s.changeUser(ctx, by, email, userChange{enable: true})
}

// SetRole gives the user another role, effective at their next request. The last enabled admin
// keeps theirs (ECONFLICT).
func (s *Service) SetRole(ctx context.Context, by payments.Staff, email string, role Role) (User, error) {
	if err := ValidateRole(role); err != nil {
		return User{}, err
	}
	return s.changeUser(ctx, by, email, userChange{role: role})
}

// SetPassword replaces the user's password, ends their console sessions (whoever knew the old
// password is out), forgets their trusted devices (a device cookie earned with the old password
// would let whoever holds it guess past the throttle: devices.go) and lifts a sign-in lockout
// of their email. So does ChangeOwnPassword, through it.
func (s *Service) SetPassword(ctx context.Context, by payments.Staff, email, password string) (User, error) {
	return s.setPassword(ctx, by, email, password, nil)
}

// setPassword is SetPassword, under the session epoch epoch when not nil (userChange.epoch).
func (s *Service) setPassword(ctx context.Context, by payments.Staff, email, password string, epoch *int) (User, error) {
	if err := ValidatePassword(password); err != nil {
		return User{}, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), s.PasswordCost)
	if err != nil {
		return User{}, fmt.Errorf("set password: hash: %w", err)
	}
	return s.changeUser(ctx, by, email, userChange{passwordHash: string(hash), epoch: epoch})
}

// EndSessions ends every console session of the user (another session epoch: each ends at its
// next request, on every replica) and forgets their trusted devices, this browser's too (it gets
// a new device token at its next sign-in): a device left behind somewhere stays signed out of the
// throttle's trust as well. The user's own "sign out everywhere else" on /account; the caller
// starts the current session again.
//
// epoch is the session epoch the caller's own console session holds: the change is refused
// (ECONFLICT) when the account has moved on since (SetPassword by an admin, another "sign out
// everywhere"): the caller's session is one of those ended, and starting it again on the new
// epoch would have kept it.
func (s *Service) EndSessions(ctx context.Context, by payments.Staff, email string, epoch int) (User, error) {
	return s.changeUser(ctx, by, email, userChange{endSessions: true, epoch: &epoch})
}

// passwordSetter is who, besides its owner, knows a password by sets for email (migration
// 00490): a console user other than the owner. nil for the command line ("cli:<os user>": an
// operator, outside the console's roles) and dev's demo seeding, neither a staff user's email.
// keep: the owner sets their own, and whoever set it before stays recorded (they could be the
// one at the keyboard, taking the account over for good).
func passwordSetter(by payments.Staff, email string) (setter any, keep bool) {
	switch {
	case !strings.Contains(by.Email, "@"):
		return nil, false
	case NormalizeEmail(by.Email) == email:
		return nil, true
	}
	return NormalizeEmail(by.Email), false
}

// userChange is one of the changes changeUser applies.
type userChange struct {
	disable      bool
	enable       bool
	endSessions  bool
	role         Role   // "" keeps the role
	passwordHash string // "" keeps the password
	// epoch, when set, is the session epoch the change was asked under (the caller's own
	// session's): another one now refuses the change (staleEpoch).
	epoch *int
}

// staleEpoch refuses a change of one's own account asked under a session epoch the account no
// longer has: a password set by an admin (whoever knew the old one must be out) or every session
// ended came between, and the caller's session is one of those it ended.
var staleEpoch = &payments.Error{Code: payments.ECONFLICT, Field: "email",
	Message: "your account changed while this was on its way (a new password, or every session ended): nothing was changed; sign in again"}

// actorStands refuses a change whose console session (payments.WithStaffSession) no longer
// stands, read from locked, the rows changeUser holds (the actor's among them): an admin
// disabled, given a new password or another role (the one the request was let through with,
// also for a role change of their own row) while their change waited on the very rows an
// offboarding changed went on as admin (an outside review: the intruder behind an offboarded
// admin set another user's password).
//
// roleChange: the change sets a role. The role the request was let through with must then still
// be the actor's, also on their own row; a change of one's own password or sessions needs no role
// (a user whose role an admin changed meanwhile could not end a session they suspected stolen: a
// review).
func actorStands(ctx context.Context, locked []User, target string, roleChange bool) error {
	cs, ok := payments.StaffSessionFrom(ctx)
	if !ok {
		return nil // the command line, dev's seeding, tests of the core
	}
	for _, u := range locked {
		if u.Email != cs.Email {
			continue
		}
		switch {
		case u.Disabled() || u.SessionEpoch != cs.Epoch:
			return payments.ErrStaffSessionEnded
		case (roleChange || u.Email != target) && cs.Role != "" && string(u.Role) != cs.Role:
			// The role the request was let through with, as queueStaffStands: a role change of
			// one's own row is no exception (an admin demoted while their own "role = admin"
			// click waited on the demotion's rows made themselves admin again: a review).
			return payments.ErrStaffRoleChanged
		case u.Email != target && u.Role != RoleAdmin:
			return payments.Errorf(payments.EFORBIDDEN, "your role is %s now: only an admin manages other users; nothing was changed", u.Role)
		}
		return nil
	}
	return payments.ErrStaffSessionEnded // removed
}

// changeUser applies one change with its audit entry in one transaction. Disabling, a new
// password and ending the sessions also delete the user's device tokens in it (forgetDevices),
// so a refused change (the last admin) forgets none.
//
// The last-admin rule needs the set of enabled admins to stay put while it is judged: two admins
// disabling each other at the same moment must not both succeed. So the statement locks the
// target row and every enabled admin's row, in id order (the same order for every caller: no
// deadlock). A concurrent change that waits on one of those rows re-reads it after the other
// commits (READ COMMITTED re-checks the WHERE of a locked row), so a just-disabled admin no
// longer counts.
func (s *Service) changeUser(ctx context.Context, by payments.Staff, email string, ch userChange) (User, error) {
	stored, email := typedForm(email), NormalizeEmail(email)
	now := s.clock.Now()
	var out User
	err := s.inTx(ctx, "change user", func(tx pgx.Tx) error {
		actor, _ := payments.StaffSessionFrom(ctx)
		rows, err := tx.Query(ctx, `SELECT `+userColumns+` FROM staff_users
			WHERE email = $1 OR email = $2 OR email = $3 OR (role = 'admin' AND disabled_at IS NULL) ORDER BY id FOR UPDATE`,
			email, actor.Email, stored)
		if err != nil {
			return payments.DBError("change user: lock", err, "")
		}
		locked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (User, error) { return scanUser(r) })
		if err != nil {
			return payments.DBError("change user: lock", err, "")
		}
		admins := 0
		for _, u := range locked {
			if u.Role == RoleAdmin && !u.Disabled() {
				admins++
			}
		}
		target := storedFirst(locked, stored, email)
		if target == nil {
			return payments.Errorf(payments.ENOTFOUND, "no staff user %s", email)
		}
		email = target.Email
		if ch.epoch != nil && target.SessionEpoch != *ch.epoch {
			return staleEpoch
		}
		if err := actorStands(ctx, locked, email, ch.role != ""); err != nil {
			return err
		}
		removesAdmin := target.Role == RoleAdmin && !target.Disabled() && (ch.disable || (ch.role != "" && ch.role != RoleAdmin))
		if removesAdmin && admins <= 1 {
			return &payments.Error{Code: payments.ECONFLICT, Field: "email",
				Message: fmt.Sprintf("%s is the last admin: make another admin first", email)}
		}

		var action, detail string
		switch {
		case ch.disable:
			action, detail = payments.AuditUserDisable, "disabled"
			if target.Disabled() {
				detail = "already disabled"
			}
			// Its sessions end for good: the epoch moves on too, so an account enabled again
			// (by hand in SQL) does not revive them.
			out, err = scanUser(tx.QueryRow(ctx, `UPDATE staff_users SET disabled_at = coalesce(disabled_at, $2),
				session_epoch = session_epoch + CASE WHEN disabled_at IS NULL THEN 1 ELSE 0 END
				WHERE id = $1 RETURNING `+userColumns, target.ID, now))
			if err == nil {
				err = forgetDevices(ctx, tx, email)
			}
			if err == nil && !target.Disabled() {
				err = payments.WithdrawProposalsOf(ctx, tx, by, email, now)
			}
		case ch.enable:
			action, detail = payments.AuditUserEnable, "enabled; sessions and trusted devices ended by the disable stay ended"
			if !target.Disabled() {
				detail = "already enabled"
			}
			// The epoch moves on again: a disable by a release before it moved the epoch left the
			// sessions of then on it (a review of this change). Sign-in failures counted against
			// the disabled account are lifted: "they sign in with their password" must hold. And
			// the proposals the disable skipped because a decision held them just then (SKIP
			// LOCKED) are withdrawn now: only the disabled_at guard kept them from approval (a
			// review of this change).
			out, err = scanUser(tx.QueryRow(ctx, `UPDATE staff_users SET disabled_at = NULL,
				session_epoch = session_epoch + CASE WHEN disabled_at IS NULL THEN 0 ELSE 1 END
				WHERE id = $1 RETURNING `+userColumns, target.ID))
			if err == nil && target.Disabled() {
				_, err = tx.Exec(ctx, `DELETE FROM staff_login_throttle WHERE email = $1`, email)
			}
			if err == nil && target.Disabled() {
				err = payments.WithdrawProposalsOf(ctx, tx, by, email, now)
			}
		case ch.role != "":
			action, detail = payments.AuditUserRole, fmt.Sprintf("role %s → %s", target.Role, ch.role)
			out, err = scanUser(tx.QueryRow(ctx, `UPDATE staff_users SET role = $2 WHERE id = $1 RETURNING `+userColumns,
				target.ID, string(ch.role)))
		case ch.passwordHash != "":
			action, detail = payments.AuditUserPassword, "password replaced; sessions ended"
			setter, keep := passwordSetter(by, email)
			out, err = scanUser(tx.QueryRow(ctx, `UPDATE staff_users SET password_hash = $2, session_epoch = session_epoch + 1,
				password_set_by = CASE WHEN $4 THEN password_set_by ELSE $3 END WHERE id = $1 RETURNING `+userColumns,
				target.ID, ch.passwordHash, setter, keep))
			if err == nil && setter != nil {
				detail += "; " + by.Email + " knows it: they count as this user for the second-person rules"
			}
			if err == nil { // the device rows first: SignIn's order (device, address, global, account)
				err = forgetDevices(ctx, tx, email)
			}
			if err == nil {
				_, err = tx.Exec(ctx, `DELETE FROM staff_login_throttle WHERE email = $1`, email)
			}
		case ch.endSessions:
			action, detail = payments.AuditUserSessions, "every session ended"
			out, err = scanUser(tx.QueryRow(ctx, `UPDATE staff_users SET session_epoch = session_epoch + 1
				WHERE id = $1 RETURNING `+userColumns, target.ID))
			if err == nil {
				err = forgetDevices(ctx, tx, email)
			}
		default:
			return errors.New("change user: no change")
		}
		if err != nil {
			return payments.DBError("change user: "+action, err, "")
		}
		return payments.AppendAudit(ctx, tx, payments.AuditEntry{Actor: by.Email, Role: by.Role, Action: action,
			Target: out.Email, Detail: detail}, now)
	})
	if err != nil {
		return User{}, err
	}
	return out, nil
}

// typedForm is an email as the releases before NormalizeEmail composed stored it (trimmed,
// lower-cased) and as a row's own stored email stays: what storedFirst looks for first.
func typedForm(s string) string {
	return strings.ToLower(strings.TrimSpace(storableText(s)))
}

// storedFirst is the user among users stored with exactly the email stored, else the one with
// its normal form email: a row stored before emails were composed (or by a normal form that was
// not stable) is itself, never the account it looks like. The Users page passes a row's stored
// email and a session keeps it: normalizing it again took an admin's change of a look-alike's
// row, or the look-alike's own session, to the other account (an outside review).
func storedFirst(users []User, stored, email string) *User {
	var found *User
	for i := range users {
		switch users[i].Email {
		case stored:
			return &users[i]
		case email:
			found = &users[i]
		}
	}
	return found
}

// untypable reports an invisible character no keyboard puts in a password: a byte-order mark, a
// zero-width space, a word joiner, a direction mark, embedding or isolate. Not every formatting
// character: the zero-width joiner and non-joiner are typed (emoji sequences, Persian).
func untypable(r rune) bool {
	switch {
	case r == '\uFEFF', r == '\u200B', r == '\u2060', r == '\u200E', r == '\u200F',
		r >= '\u202A' && r <= '\u202E', r >= '\u2066' && r <= '\u2069':
		return true
	}
	return false
}
