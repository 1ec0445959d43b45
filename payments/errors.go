package payments

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Error codes of the domain. The web layer maps them to HTTP status in exactly one place
// (web's error handler); nothing else looks at status codes.
const (
	EINVALID  = "invalid"     // bad input; the message names the field → 422 (or 400)
	ENOTFOUND = "not_found"   // → 404
	ECONFLICT = "conflict"    // state does not allow it, other parameters active, … → 409
	EEXPIRED  = "expired"     // a one-time code past its expiry → 410
	ELOCKED   = "locked"      // attempts used up → 429
	EWRONG    = "wrong_code"  // a one-time code that does not match → 422
	EBUSY     = "busy"        // the same work is in flight elsewhere; retry later → 409 + Retry-After
	EUNAVAIL  = "unavailable" // a lock or dependency timed out, the database is unreachable → 503 + Retry-After
	EINTERNAL = "internal"    // a bug or an unexpected failure → 500, logged

	EUNAUTHENTICATED = "unauthenticated" // no credentials, or ones nobody issued → 401
	EFORBIDDEN       = "forbidden"       // known caller, not allowed (revoked key, scope, role) → 403

	// A gateway webhook that cannot be accepted (WebhookVerifier). Both are refusals before
	// anything is written; the gateway redelivers, and a forger learns nothing more.
	EMALFORMED    = "malformed"     // a signature header or event body that cannot be read → 400
	EBADSIGNATURE = "bad_signature" // no signature matches a configured secret, or it is stale → 401
)

// Error is the one error type of the domain: a code for machines and a message for people.
type Error struct {
	Code    string
	Message string
	Field   string // for EINVALID: which input field
	// RetryAfter, when positive, is how long the caller should wait before asking again: a
	// limit that lapses at a known time (ELOCKED: the code budget of a payment). The web layer
	// sends it as Retry-After; without it EBUSY and EUNAVAIL get a short default there.
	RetryAfter time.Duration
	Err        error // wrapped cause, if any
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds a domain error with a code.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid builds an EINVALID error naming the field.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: EINVALID, Field: field, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first domain error in err's chain; EUNAVAIL for a database
// outage that reached the caller without passing dbError (a failed connect in a middleware, a
// query wrapped with %w on its way up); EINTERNAL otherwise.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	if DatabaseUnavailable(err) || lockTimedOut(err) {
		return EUNAVAIL
	}
	if unstorableText(err) {
		return EMALFORMED
	}
	return EINTERNAL
}

// lockTimedOut reports whether a statement gave up waiting for a lock (SQLSTATE 55P03: the
// transaction's lock_timeout fired) or was cut short (57014 query_canceled: a statement_timeout
// an operator set on the role or in DATABASE_URL, a DBA's pg_cancel_backend). Whatever wrapped
// it, that is "busy, ask again" (503), not a fault: a statement that wrapped it with fmt.Errorf
// rather than dbError answered a 500 (an outside review: a cancel's code behind a held
// challenge row), and a statement_timeout firing before lock_timeout did (another review).
func lockTimedOut(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && timedOutCode(pe.Code)
}

// QueryCanceled reports whether a statement was cancelled (57014): by a statement_timeout or a
// DBA, or by the caller's own context ending (pgx sends a cancel request). The web layer tells
// the last apart by the request's context: a cut at the request's bound or a client's hang-up,
// not a busy payment.
func QueryCanceled(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014"
}

// timedOutCode: lock_not_available (55P03) or query_canceled (57014).
func timedOutCode(code string) bool { return code == "55P03" || code == "57014" }

// unstorableMessage is what a client is told when its input held bytes no text column can keep.
const unstorableMessage = "the request holds characters that cannot be stored (a NUL byte or invalid UTF-8); nothing was changed"

// unstorableText reports whether PostgreSQL refused a statement because a text value held a NUL
// byte or a byte sequence that is not UTF-8 (SQLSTATE 22021 character_not_in_repertoire, 22P05
// untranslatable_character). Such bytes come only from the request: a client's mistake (400),
// not the service's, wherever a field forgot to check for them, and the statement's transaction
// rolled back.
func unstorableText(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "22021" || pe.Code == "22P05")
}

// busyMessage is what a client is told when a lock wait timed out.
const busyMessage = "the payment is busy; try again"

// unavailableMessage is what a client is told about a database outage.
const unavailableMessage = "the service cannot reach its database right now; try again shortly"

// ErrorMessage returns the human message of a domain error, or a generic one for internal errors
// (whose details must not leak to clients).
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Code != EINTERNAL {
		return e.Message
	}
	if e == nil && DatabaseUnavailable(err) {
		return unavailableMessage
	}
	if e == nil && unstorableText(err) {
		return unstorableMessage
	}
	if e == nil && lockTimedOut(err) {
		return busyMessage
	}
	return "internal error"
}

// RetryAfter returns the RetryAfter of the first domain error in err's chain (0: none said).
func RetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// DatabaseUnavailable reports whether err says the database could not be reached or went away
// mid-request — nothing about the request itself, so asking again shortly is the right answer
// (503 + Retry-After), never a 500:
//
//   - a connection that could not be made (pgconn.ConnectError: refused, DNS, "the database
//     system is starting up / shutting down", too many connections at connect time);
//   - SQLSTATE class 08 (connection exception), 57P01 admin_shutdown (a backend terminated by
//     pg_terminate_backend or a fast shutdown), 57P02 crash_shutdown, 57P03 cannot_connect_now,
//     53300 too_many_connections, 25006 read_only_sql_transaction (the database reached is a
//     standby, or an old primary back as one, during a failover: every write refused);
//   - the socket failing under a query: connection reset or refused, a broken pipe, an
//     unexpected EOF, a connection pgx had already closed, any other socket error.
//
// What is not an outage stays what it was: a statement or lock timeout (busy, also 503:
// lockTimedOut), a constraint, a bug.
func DatabaseUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var ge *GatewayError
	if errors.As(err, &ge) {
		return false // the gateway's network trouble is not the database's
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case len(pe.Code) == 5 && pe.Code[:2] == "08",
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", pe.Code == "53300", pe.Code == "25006":
			return true
		}
		return false
	}
	if errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe)
}

// DBError translates a database error at the one edge for packages beside the core too
// (package access): no rows → ENOTFOUND with the message (when notFoundFormat is set), a lock
// wait past lock_timeout or a database outage → EUNAVAIL, the core's constraints → their codes, anything else wrapped
// with the operation's name.
func DBError(op string, err error, notFoundFormat string, args ...any) error {
	return dbError(op, err, notFoundFormat, args...)
}
