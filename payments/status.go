package payments

import "strings"

// Status is a payment session's state (design.md, "Payment session states").
type Status string

const (
	StatusRegistering Status = "Registering" // claimed locally, registration not confirmed
	StatusRegistered  Status = "Registered"  // the gateway knows it; waiting for the customer
	StatusUnknown     Status = "Unknown"     // the last gateway call had no trustworthy answer
	StatusAuthorized  Status = "Authorized"  // approved, funds held
	StatusCompleted   Status = "Completed"   // captured; order Paid; one PaymentReceived entry
	StatusFailed      Status = "Failed"      // terminal; never from Completed
	StatusCanceling   Status = "Canceling"   // code consumed, reverse requested, not yet confirmed
	StatusCanceled    Status = "Canceled"    // the gateway confirmed the reverse
)

// AllStatuses in display order.
var AllStatuses = []Status{StatusRegistering, StatusRegistered, StatusUnknown, StatusAuthorized,
	StatusCompleted, StatusFailed, StatusCanceling, StatusCanceled}

// ActiveStatuses are the states of which an order has at most one session (the partial unique
// index payment_sessions_one_active_per_order lists the same set).
var ActiveStatuses = []Status{StatusRegistering, StatusRegistered, StatusUnknown, StatusAuthorized, StatusCanceling}

// activeStatusSQL is ActiveStatuses as an SQL predicate with literals, not a parameter
// (status = ANY($1)): the planner must see the constants to use the partial indexes over active
// sessions (payment_sessions_one_active_per_order, payment_sessions_due, migration 00310's) in a
// prepared statement's generic plan. With a parameter the generic plan cannot use them, so
// PostgreSQL plans the statement again on every execution (a seq scan is the generic
// alternative) — measured at 0.3–0.5 ms of planning per Create and per patrol claim.
var activeStatusSQL = func() string {
	q := make([]string, len(ActiveStatuses))
	for i, s := range ActiveStatuses {
		q[i] = "'" + string(s) + "'"
	}
	return "status IN (" + strings.Join(q, ", ") + ")"
}()

// Active reports whether s is one of ActiveStatuses.
func (s Status) Active() bool {
	for _, a := range ActiveStatuses {
		if s == a {
			return true
		}
	}
	return false
}

// Terminal reports whether nothing may follow s.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCanceled
}

// terminalStatusSQL lists the Terminal statuses as SQL literals (for "status IN (…)").
const terminalStatusSQL = `'` + string(StatusCompleted) + `', '` + string(StatusFailed) + `', '` + string(StatusCanceled) + `'`

// Valid reports whether s is a known status.
func (s Status) Valid() bool {
	for _, a := range AllStatuses {
		if s == a {
			return true
		}
	}
	return false
}

// Cancelable reports whether a cancel may be requested for a session in s.
func (s Status) Cancelable() bool {
	switch s {
	case StatusRegistering, StatusRegistered, StatusUnknown, StatusAuthorized:
		return true
	}
	return false
}

// transitions is THE table of allowed edges: for each target state, the states it may be
// entered from. applyTransition turns a row of it into `UPDATE … WHERE status = ANY(from)`, so
// the database, not a prior read, decides whether the edge is still allowed.
//
//   - Failed may be entered from anything but Completed (and the other terminals).
//   - Canceled only from Canceling: a cancel always passes through a consumed code and a
//     reverse operation.
//   - Completed from Canceling: the customer's payment won the race against our reverse.
//   - Registered from Unknown: a Check found the registration we had lost the answer of.
//   - Unknown only from Registering: a read (Check) that times out changes nothing; only a
//     registration whose answer was lost leaves us not knowing whether the gateway acted.
var transitions = map[Status][]Status{
	StatusRegistered: {StatusRegistering, StatusUnknown},
	StatusUnknown:    {StatusRegistering},
	StatusAuthorized: {StatusRegistering, StatusRegistered, StatusUnknown},
	StatusCompleted:  {StatusRegistering, StatusRegistered, StatusUnknown, StatusAuthorized, StatusCanceling},
	StatusFailed:     {StatusRegistering, StatusRegistered, StatusUnknown, StatusAuthorized, StatusCanceling},
	StatusCanceling:  {StatusRegistering, StatusRegistered, StatusUnknown, StatusAuthorized},
	StatusCanceled:   {StatusCanceling},
}

// CanTransition reports whether the edge from → to is in the table.
func CanTransition(from, to Status) bool {
	for _, f := range transitions[to] {
		if f == from {
			return true
		}
	}
	return false
}

// allowedFrom returns the states `to` may be entered from, as strings for SQL.
func allowedFrom(to Status) []string {
	from := transitions[to]
	out := make([]string, len(from))
	for i, f := range from {
		out[i] = string(f)
	}
	return out
}

func statusStrings(ss []Status) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}
