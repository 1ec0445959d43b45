package payments

import (
	"errors"
	"fmt"
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
	EUNAVAIL  = "unavailable" // a lock or dependency timed out → 503
	EINTERNAL = "internal"    // a bug or an unexpected failure → 500, logged

	EFORBIDDEN = "forbidden" // known caller, not allowed (revoked key, scope, role) → 403

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
	Err     error  // wrapped cause, if any
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

// ErrorCode returns the code of the first domain error in err's chain, EINTERNAL otherwise.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EINTERNAL
}

// ErrorMessage returns the human message of a domain error, or a generic one for internal errors
// (whose details must not leak to clients).
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Code != EINTERNAL {
		return e.Message
	}
	return "internal error"
}
